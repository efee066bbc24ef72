"""benchmarks/fragmentation.py's pieces that need neither the artifact's build nor the full trace: reading FGD's
log, writing its pod input, and the comparison against the published table on the vendored sample."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks import fragmentation as bench
from benchmarks.trace_ceiling import lp_ceiling

DATA = Path(__file__).parent / "data"


def test_the_artifacts_alloc_lines_give_the_same_levels_as_the_replay() -> None:
    lines = [f'time="t" level=info msg="[Alloc]; Used nodes: 1; Used GPUs: 1; Used GPU Milli: {used}; '
             f'Total GPUs: 2; Arrived GPU Milli: {arrived}\\n"' for used, arrived in ((700, 700), (1400, 1400),
                                                                                    (1400, 2100))]
    levels = bench.allocation_levels("\n".join(["noise", *lines]))
    assert len(levels) == 131
    assert levels[0] == levels[35] == 35.0 and levels[36] == levels[70] == 70.0
    assert levels[105] == 70.0 and levels[130] == 70.0
    with pytest.raises(bench.KubegpuError, match="no '\\[Alloc\\]"):
        bench.allocation_levels("nothing here")


def test_pod_input_carries_requests_and_gpu_annotations(tmp_path: Path) -> None:
    sample = gzip.decompress((DATA / "openb_pod_list_gpuspec33_sample.csv.gz").read_bytes())
    (tmp_path / "openb_pod_list_sample.csv").write_bytes(sample)
    documents = [json.loads(d) for d in bench._pod_yaml(tmp_path, "sample").split("\n---\n")]
    assert len(documents) == 510
    pinned = next(d for d in documents if "alibabacloud.com/gpu-card-model" in d["metadata"].get("annotations", {}))
    annotations = pinned["metadata"]["annotations"]
    assert int(annotations["alibabacloud.com/gpu-count"]) >= 1 and int(annotations["alibabacloud.com/gpu-milli"]) > 0
    assert pinned["spec"]["containers"][0]["resources"]["requests"]["cpu"].endswith("m")


def test_published_table_and_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert len(bench.PUBLISHED) == 17 and bench.PUBLISHED["default"][-1] == 95.23
    assert bench._seeds("42-44,50") == [42, 43, 44, 50]
    assert bench.main(["--trace-dir", str(tmp_path)]) == 1
    assert f"--trace-dir {tmp_path}: no openb_node_list_gpu_node.csv" in capsys.readouterr().err


def _trace(tmp_path: Path, gpu_milli: int, variant: str = "one") -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,65536,4,T4\n")
    (tmp_path / f"openb_pod_list_{variant}.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"p{i},1000,1024,1,{gpu_milli}\n" for i in range(3)))
    return tmp_path


def test_share_packing_charges_the_leftover_no_share_can_use(tmp_path: Path) -> None:
    # 4 GPUs; shares of 810 arrive until 4,050 thousandths. Packed offline every one takes a GPU (a fifth beyond
    # the cluster): five leftovers of 190 that nothing fits. The ceiling places four; all five never fit. kubegpu
    # placed four by then (the fifth found no room): the ceiling with those four as a floor is its own 81 %.
    assert bench.most_common_share(_trace(tmp_path, 810), "one") == 810
    assert bench.share_packing(tmp_path, "one", 42, 810) == (76.25, 81.0, None, 81.0, 81.0)
    # quarters pack exactly: nothing is left over, and kubegpu places all sixteen arrived by 100 %
    assert bench.share_packing(_trace(tmp_path, 250), "one", 42, 250) == (100.0, 100.0, 100.0, 100.0, 100.0)


def test_the_ceiling_with_kubegpus_shares_as_floors_sees_the_arrivals_its_replay_saw(tmp_path: Path) -> None:
    # 4 GPUs, shares of 600, 500 and 300 shuffled by the seed: whichever arrive before 100 %, the replay's placed
    # shares are among the arrived ones (lp_ceiling would refuse a floor above what arrived), and they lie between
    # what kubegpu allocated and the plain ceiling
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,65536,4,T4\n")
    (tmp_path / "openb_pod_list_mix.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
        f"p{i},1000,1024,1,{(600, 500, 300)[i % 3]}\n" for i in range(9)))
    for seed in range(42, 46):
        gpus, shares, _ = bench.arrived_at_100(tmp_path, "mix", seed)
        result = bench._kubegpu(tmp_path, "mix", seed, "kubegpu")
        assert all(result.shares_placed_at_100[size] <= shares[size] for size in result.shares_placed_at_100)
        placed = sum(size * count for size, count in result.shares_placed_at_100.items())
        assert result.allocated_percent[100] == 100.0 * placed / (gpus * 1000)
        row = bench.share_packing(tmp_path, "mix", seed, 600)
        assert row.policy_at_100 == result.allocated_percent[100]
        assert row.policy_at_100 <= row.ceiling_policy_shares + 1e-9 <= row.ceiling + 2e-9


def test_share_packing_table_names_the_size_and_says_when_they_do_not_all_fit(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _trace(tmp_path, 810, "default")
    out = tmp_path / "rows.json"
    assert bench.main(["--trace-dir", str(tmp_path), "--share-packing", "--variants", "default", "--seeds", "42",
                       "--json", str(out)]) == 0
    assert ("| default | 76.25 | 81.00 | they do not all fit (size 810) | 81.00 | 81.00 | 1.000 |"
            in capsys.readouterr().out)
    [row] = json.loads(out.read_text())
    assert row["packedOfflineAt100"] == 76.25 and row["ceilingAt100"] == 81.0 and row["mostCommonShareMilli"] == 810
    assert row["ceilingAllOfMostCommonShareAt100"] is None and row["perSeedCeilingAt100"] == [81.0]
    assert row["ceilingKubegpuSharesAt100"] == row["kubegpuAt100"] == 81.0
    assert row["perSeedCeilingKubegpuSharesAt100"] == row["perSeedKubegpuAt100"] == [81.0]
    assert row["kubegpuOverCeilingKubegpuShares"] == 1.0


def test_lp_ceiling_on_cases_solved_by_hand() -> None:
    # two GPUs, 600 + 400 twice: both GPUs full
    assert lp_ceiling({600: 2, 400: 2}, 0, 2) == 100.0
    # one GPU, two shares of 600: only one fits
    assert lp_ceiling({600: 2}, 0, 1) == 60.0
    # 810 + 190 fill two GPUs, whole-GPU tasks (3 GPUs asked) the other two
    assert lp_ceiling({810: 2, 190: 2}, 3000, 4) == 100.0
    # whole-GPU thousandths count as divisible, bounded by what arrived
    assert lp_ceiling({}, 3500, 4) == 87.5


def test_lp_ceiling_may_skip_a_share_and_a_floor_forbids_it() -> None:
    # one GPU: the two 500s fill it; placing the 600 instead leaves 400 that no 500 fits
    assert lp_ceiling({600: 1, 500: 2}, 0, 1) == 100.0
    assert lp_ceiling({600: 1, 500: 2}, 0, 1, at_least={600: 1}) == 60.0
    # three GPUs: 500 + 500 on one, whole GPUs on two; with both 810s placed, two GPUs keep 190 idle
    assert lp_ceiling({810: 2, 500: 2}, 2000, 3) == 100.0
    assert lp_ceiling({810: 2, 500: 2}, 2000, 3, at_least={810: 2}) == pytest.approx(100 * (2 * 810 + 1000) / 3000)
    # a GPU holds one 700 at most: three never fit on two
    assert lp_ceiling({700: 3, 300: 2}, 0, 2) == 100.0
    assert lp_ceiling({700: 3, 300: 2}, 0, 2, at_least={700: 3}) is None


def test_lp_ceiling_with_floors_for_two_sizes() -> None:
    # two GPUs, one share each of 700, 600, 300 and two of 500: 700 + 300 and 500 + 500 fill both
    shares = {700: 1, 600: 1, 500: 2, 300: 1}
    assert lp_ceiling(shares, 0, 2) == 100.0
    assert lp_ceiling(shares, 0, 2, at_least={700: 1}) == 100.0
    # the 600 placed: its GPU holds 300 more at most (the one 300), the other the two 500s: 1,900
    assert lp_ceiling(shares, 0, 2, at_least={600: 1}) == pytest.approx(95.0)
    # both: they take a GPU each and only the one 300 joins either; no 500 fits beside them: 1,600
    assert lp_ceiling(shares, 0, 2, at_least={700: 1, 600: 1}) == pytest.approx(80.0)
    # the 300 too: no size packed alone meets all three floors on two GPUs, only 700 + 300 beside the 600
    assert lp_ceiling(shares, 0, 2, at_least={700: 1, 600: 1, 300: 1}) == pytest.approx(80.0)
    # each floor fits alone, not both: 600 + 400 + 400 pass one GPU
    assert lp_ceiling({600: 2, 400: 2}, 0, 1, at_least={600: 1}) == 100.0
    assert lp_ceiling({600: 2, 400: 2}, 0, 1, at_least={400: 2}) == 80.0
    assert lp_ceiling({600: 2, 400: 2}, 0, 1, at_least={600: 1, 400: 2}) is None


def test_lp_ceiling_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="share size 1000"):
        lp_ceiling({1000: 1}, 0, 1)
    with pytest.raises(ValueError, match="at_least 3 shares of 600: only 2 arrived"):
        lp_ceiling({600: 2}, 0, 1, at_least={600: 3})
    with pytest.raises(ValueError, match="at_least -1 shares of 600: must not be negative"):
        lp_ceiling({600: 2}, 0, 1, at_least={600: -1})
    with pytest.raises(ValueError, match="at_least 1 shares of 400: only 0 arrived"):
        lp_ceiling({600: 2}, 0, 1, at_least={600: 1, 400: 1})

