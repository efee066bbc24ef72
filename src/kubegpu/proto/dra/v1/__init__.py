"""Generated protocol code (scripts/gen_protos.sh)."""
