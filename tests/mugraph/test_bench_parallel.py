"""``mugraph bench --gpus``: rows dealt to GPUs, each GPU's process on its own share of whole
physical cores and seeing only its GPU; the rows' CSV lines merged in the table's order.
The processes here are stand-ins (no GPU needed): they report what they were given."""

import os
import sys

import pytest

from mugraph.core.errors import ConfigError
from mugraph.pipeline import parallel


def test_cores_group_hyperthreads_and_split_into_whole_cores():
    sib = {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2,6", 6: "2,6", 3: "3,7", 7: "3,7"}
    cores = parallel.physical_cores(range(8), siblings=sib.__getitem__)
    assert cores == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert parallel.core_groups(2, cores) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert parallel.core_groups(3, cores) == [[0, 1, 4, 5], [2, 6], [3, 7]]  # uneven: the first get more
    with pytest.raises(ConfigError, match="5 GPUs need at least 5 CPU cores"):
        parallel.core_groups(5, cores)
    # no topology readable: every CPU is a core of its own
    def unreadable(c):
        raise OSError

    assert parallel.physical_cores([0, 1, 2], siblings=unreadable) == [[0], [1], [2]]


def test_rows_are_dealt_in_turn_and_gpu_lists_are_checked():
    jobs = [("a", 1), ("a", 8), ("b", 1), ("b", 8), ("c", 1)]
    assert parallel.assign(jobs, 2) == [[("a", 1), ("b", 1), ("c", 1)], [("a", 8), ("b", 8)]]
    assert parallel.parse_gpus("all", 4) == [0, 1, 2, 3]
    assert parallel.parse_gpus("2, 0", 4) == [2, 0]
    for bad in ("0,0", "4", "-1", "x", ""):
        with pytest.raises(ConfigError, match="--gpus"):
            parallel.parse_gpus(bad, 4)
    with pytest.raises(ConfigError, match="no CUDA device"):
        parallel.parse_gpus("all", 0)


STAND_IN = r"""
import csv, os, sys
name, b, workers, folder = sys.argv[1:5]
os.makedirs(folder, exist_ok=True)
if name == "fails":
    print("row failed"); sys.exit(3)
with open(os.path.join(folder, "bench.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["name", "b", "gpu", "cpus", "workers", "threads"])
    w.writerow([name, b, os.environ["CUDA_VISIBLE_DEVICES"], " ".join(map(str, sorted(os.sched_getaffinity(0)))),
                workers, " ".join(os.environ[v] for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"))])
print("row", name, b)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_each_queue_runs_on_its_gpu_and_cores_and_rows_merge_in_table_order(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    groups = [[cpus[0]], [cpus[-1]]]
    names, batches = ["x", "y"], [1, 8]
    jobs = [(n, b) for n in names for b in batches]
    queues = parallel.assign(jobs, 2)
    lines = []
    codes = parallel.run_queues(
        queues, [3, 5], groups,
        lambda job, share, where: [sys.executable, "-c", STAND_IN, job[0], str(job[1]), str(share), str(where)],
        tmp_path, echo=lines.append)
    assert codes == [0, 0, 0, 0]
    rows = parallel.merge_csv(tmp_path, lambda r: (names.index(r["name"]), batches.index(int(r["b"]))))
    assert [(r["name"], r["b"]) for r in rows] == [("x", "1"), ("x", "8"), ("y", "1"), ("y", "8")]
    by = {(r["name"], r["b"]): r for r in rows}
    assert by[("x", "1")]["gpu"] == "3" and by[("x", "8")]["gpu"] == "5"  # dealt in turn
    assert by[("x", "1")]["cpus"] == str(cpus[0]) and by[("y", "8")]["cpus"] == str(cpus[-1])
    assert all(r["workers"] == "1" for r in rows)
    assert all(r["threads"] == "1 1 1" for r in rows)  # torch's, numba's and the BLAS's pools: the share
    assert "[gpu3] row x 1" in lines and "[gpu5] row y 8" in lines
    assert (tmp_path / "bench.csv").read_text().splitlines()[0] == "name,b,gpu,cpus,workers,threads"


def test_a_failing_row_stops_its_queue_only(tmp_path):
    queues = [[("fails", 1), ("x", 1)], [("y", 1)]]
    codes = parallel.run_queues(
        queues, [0, 1], [[0], [0]],
        lambda job, share, where: [sys.executable, "-c", STAND_IN, job[0], str(job[1]), str(share), str(where)],
        tmp_path, echo=lambda line: None)
    assert sorted(codes) == [0, 3]
    rows = parallel.merge_csv(tmp_path, lambda r: r["name"])
    assert [r["name"] for r in rows] == ["y"]


def test_bench_gpus_without_a_gpu_is_one_line(capsys):
    from mugraph.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--gpus", "all", "--name", "lora", "--batch", "1"])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]


def test_bench_csv_lines_read_back_into_rows(tmp_path):
    import csv

    from mugraph.pipeline.bench import BenchRow, _CsvSink, rows_from_csv

    rows = [BenchRow("gqa", 8, 19.5, 11.25, eager_us=98.4, sdpa_us=39.5, kernels=2, rel_error=2.9e-4,
                     found_by="split-loop", search_s=49.2, verified=16, ref_us=None, reach="kernels", reach_rank=7,
                     reach_timed=True, structure="128x16 + 32x4", row_s=115.5),
            BenchRow("lora", 1, None, 2.0)]
    sink = _CsvSink(tmp_path / "bench.csv")
    for r in rows:
        sink.write(r)
    with open(tmp_path / "bench.csv", newline="") as f:
        assert rows_from_csv(list(csv.DictReader(f))) == rows


def test_a_hung_row_is_killed_at_the_time_limit_and_its_queue_goes_no_further(tmp_path):
    hang = "import time; print('started', flush=True); time.sleep(60)"
    lines = []
    codes = parallel.run_queues(
        [[("hangs", 1), ("x", 1)], [("y", 1)]], [0, 1], [[0], [0]],
        lambda job, share, where: ([sys.executable, "-c", hang] if job[0] == "hangs" else
                                   [sys.executable, "-c", STAND_IN, job[0], str(job[1]), str(share), str(where)]),
        tmp_path, echo=lines.append, timeout=3)
    assert sorted(codes) == [0, parallel.TIMED_OUT]
    assert any("killed after 3 s" in line for line in lines)
    assert [r["name"] for r in parallel.merge_csv(tmp_path, lambda r: r["name"])] == ["y"]
