"""EC2NodeClass validation (Karpenter's CEL rules as one-line errors) and its generated CRD in deploy/crds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kubegpu.autoscaler.aws.nodeclass import CRD_HEADER, crd, parse_ec2nodeclass
from kubegpu.errors import ConfigError
from tests.autoscaler.aws.moto_env import nodeclass_manifest

CRD_FILE = Path(__file__).resolve().parents[3] / "deploy" / "crds" / "ec2nodeclasses.kubegpu.io.yaml"


def test_crd_file_is_the_generated_one_and_a_valid_kubernetes_object() -> None:
    on_disk = yaml.safe_load(CRD_FILE.read_text())
    assert on_disk == crd(), "regenerate: python -m kubegpu.autoscaler.aws.nodeclass"
    assert CRD_FILE.read_text().startswith("# " + CRD_HEADER.splitlines()[0])
    assert kubernetes_validate.validate(on_disk, "1.30", strict=True)


def test_defaults_follow_karpenter() -> None:
    spec = parse_ec2nodeclass(nodeclass_manifest()).spec
    assert spec.metadataOptions.model_dump() == {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                                                 "httpPutResponseHopLimit": 1, "httpTokens": "required"}
    assert spec.ami_family == "AL2023"


@pytest.mark.parametrize(("change", "message"), [
    ({"instanceProfile": "p"}, "spec: must specify exactly one of ['role', 'instanceProfile']"),
    ({"amiSelectorTerms": [{"alias": "al2023@latest"}, {"id": "ami-123"}]},
     "spec: amiSelectorTerms: 'alias' is mutually exclusive, it must be the only term"),
    ({"amiSelectorTerms": [{"alias": "ubuntu@latest"}]}, "spec.amiSelectorTerms[0].alias: alias 'ubuntu@latest'"),
    ({"amiSelectorTerms": [{"alias": "windows2022@v1"}]}, "Windows aliases only support @latest"),
    ({"amiSelectorTerms": [{"id": "ami-123"}]}, "spec: amiFamily: required unless amiSelectorTerms uses an alias"),
    ({"amiSelectorTerms": [{"id": "ami-1", "name": "x"}], "amiFamily": "AL2023"},
     "spec.amiSelectorTerms[0]: id may not be combined with other fields"),
    ({"subnetSelectorTerms": []}, "spec.subnetSelectorTerms: List should have at least 1 item"),
    ({"subnetSelectorTerms": [{"id": "subnet-1", "tags": {"a": "b"}}]},
     "spec.subnetSelectorTerms[0]: expected exactly one of id or tags"),
    ({"securityGroupSelectorTerms": [{"tags": {"": "x"}}]}, "spec.securityGroupSelectorTerms[0].tags"),
    ({"tags": {"karpenter.sh/nodepool": "x"}}, "spec.tags: tag 'karpenter.sh/nodepool' is restricted"),
    ({"tags": {"kubernetes.io/cluster/c": "owned"}}, "spec.tags: tag 'kubernetes.io/cluster/c' is restricted"),
    ({"capacityReservationSelectorTerms": [{"id": "cr-1", "ownerID": "123456789012"}]},
     "id may not be combined with other fields"),
    ({"metadataOptions": {"httpPutResponseHopLimit": 65}}, "spec.metadataOptions.httpPutResponseHopLimit"),
    ({"blockDeviceMappings": [{"rootVolume": True, "ebs": {"volumeSize": "20Gi"}},
                              {"rootVolume": True, "ebs": {"volumeSize": "20Gi"}}]},
     "must have only one blockDeviceMappings with rootVolume"),
    ({"blockDeviceMappings": [{"ebs": {"volumeType": "gp3"}}]}, "ebs needs snapshotID or volumeSize"),
    ({"blockDeviceMappings": [{"ebs": {"volumeSize": "65T"}}]}, "volumeSize '65T' must be a size"),
    ({"kubelet": {"imageGCHighThresholdPercent": 50, "imageGCLowThresholdPercent": 60}},
     "imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent"),
])
def test_invalid_classes_are_one_line_naming_the_field(change: dict[str, Any], message: str) -> None:
    manifest = nodeclass_manifest()
    manifest["spec"].update(change)
    with pytest.raises(ConfigError) as err:
        parse_ec2nodeclass(manifest, "classes.yaml")
    text = str(err.value)
    assert text.startswith("classes.yaml: EC2NodeClass gpu: ") and message in text and "\n" not in text
    # the CRD schema agrees wherever it can say it (CEL-only rules are the model's alone)
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if "subnetSelectorTerms" in change and not change["subnetSelectorTerms"]:
        assert not jsonschema.Draft7Validator(schema).is_valid(manifest)


def test_unknown_kubelet_fields_pass_through() -> None:
    manifest = nodeclass_manifest(kubelet={"maxPods": 50, "cpuManagerPolicy": "static"})
    kubelet = parse_ec2nodeclass(manifest).spec.kubelet
    assert kubelet is not None and kubelet.maxPods == 50
    assert kubelet.model_dump(exclude_none=True)["cpuManagerPolicy"] == "static"


def test_validate_config_checks_ec2nodeclass_files(tmp_path: Path) -> None:
    from tests.autoscaler.test_cli import invoke

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(nodeclass_manifest()))
    broken = nodeclass_manifest()
    broken["spec"]["securityGroupSelectorTerms"] = [{"id": "sg-1", "name": "x"}]
    bad.write_text(yaml.safe_dump(broken))
    code, out = invoke("validate-config", str(good))
    assert code == 0 and "AL2023, 1 AMI / 1 subnet / 1 security-group terms" in out
    code, out = invoke("validate-config", str(bad))
    assert code != 0 and "spec.securityGroupSelectorTerms[0]: expected exactly one of id, name or tags" in out
