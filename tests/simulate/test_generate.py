"""The synthetic trace generator: deterministic by seed, and shaped as asked."""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest

from sftq_server.simulate.generate import (
    add_generate_arguments,
    generate,
    generate_command,
    generate_from_args,
)
from sftq_server.simulate.trace import load_trace, write_trace


def test_the_same_seed_gives_the_same_file_and_another_seed_another(tmp_path: Path) -> None:
    paths = [tmp_path / f"{n}.csv" for n in range(3)]
    for path, seed in zip(paths, (7, 7, 8), strict=True):
        write_trace(generate(seed=seed, jobs=300, days=2), path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_a_generated_trace_loads_back_unchanged(tmp_path: Path) -> None:
    trace = generate(seed=3, jobs=500, days=2, after_rate=0.3)
    for name in ("g.csv", "g.jsonl"):
        write_trace(trace, tmp_path / name)
        assert load_trace(tmp_path / name) == trace


def test_job_count_users_and_heavy_share() -> None:
    trace = generate(seed=2, jobs=5000, users=30, heavy_users=3, heavy_share=0.5)
    assert len(trace.jobs) == 5000
    per_user = Counter(job.user for job in trace.jobs)
    assert len(per_user) == 30
    heavy = {user: n for user, n in per_user.items() if user.startswith("heavy")}
    assert len(heavy) == 3 and sum(heavy.values()) == 2500
    light = [n for user, n in per_user.items() if user.startswith("light")]
    # Each heavy user submits several times what the busiest light user does.
    assert min(heavy.values()) > 2 * max(light)
    assert [job.submit_at for job in trace.jobs] == sorted(job.submit_at for job in trace.jobs)
    assert all(0 <= job.submit_at < 7 * 86400 for job in trace.jobs)


def test_few_jobs_still_reach_every_light_user() -> None:
    trace = generate(seed=5, jobs=12, users=10, heavy_users=2, heavy_share=0.2)
    assert len({job.user for job in trace.jobs}) == 10


def hour_counts(amplitude: float) -> list[int]:
    trace = generate(seed=11, jobs=5000, days=7, daily_amplitude=amplitude)
    counts = Counter(int(job.submit_at % 86400 // 3600) for job in trace.jobs)
    return [counts[h] for h in range(24)]


def test_arrivals_follow_the_day() -> None:
    hours = hour_counts(0.6)
    afternoon, night = sum(hours[13:18]), sum(hours[1:6])
    # The rate's peak-to-trough ratio is (1 + 0.6) / (1 - 0.6) = 4 at 15:00 against 03:00.
    assert afternoon > 2.5 * night, hours
    assert max(range(24), key=hours.__getitem__) in range(12, 19)
    flat = hour_counts(0.0)
    assert sum(flat[13:18]) < 1.3 * sum(flat[1:6]), flat


def test_run_times_are_log_normal_around_the_median() -> None:
    trace = generate(seed=4, jobs=4000, run_median_seconds=1800, run_sigma=1.0,
                     fail_rate=0, cancel_rate=0)
    logs = [math.log(job.run_seconds) for job in trace.jobs if job.run_seconds > 60]
    assert statistics.median(job.run_seconds for job in trace.jobs) == pytest.approx(1800,
                                                                                     rel=0.1)
    assert statistics.stdev(logs) == pytest.approx(1.0, abs=0.1)
    # Log-normal: the logs are symmetric (skew near 0), the times themselves right-skewed.
    mean, spread = statistics.fmean(logs), statistics.stdev(logs)
    skew = statistics.fmean(((x - mean) / spread) ** 3 for x in logs)
    assert abs(skew) < 0.2
    assert statistics.fmean(job.run_seconds for job in trace.jobs) > 1.4 * 1800
    assert all(job.run_seconds >= 60 and job.run_seconds.is_integer() for job in trace.jobs)


def test_outcomes_gpus_kinds_and_after_chains() -> None:
    trace = generate(seed=9, jobs=5000, fail_rate=0.1, cancel_rate=0.05, after_rate=0.2,
                     gpu_choices=(1, 8))
    outcomes = Counter(job.outcome for job in trace.jobs)
    assert outcomes["FAIL"] == pytest.approx(500, rel=0.2)
    assert outcomes["CANCELLED"] == pytest.approx(250, rel=0.25)
    assert all(job.outcome_at is not None and job.outcome_at >= 1
               for job in trace.jobs if job.outcome == "CANCELLED")
    assert all(job.outcome_at is None for job in trace.jobs if job.outcome != "CANCELLED")
    gpus = Counter(job.gpu_count for job in trace.jobs)
    assert set(gpus) == {1, 8} and gpus[1] > 4 * gpus[8]
    assert set(Counter(job.kind for job in trace.jobs)) == {"SFT", "DPO", "RFT"}
    by_id = {job.id: job for job in trace.jobs}
    chained = [job for job in trace.jobs if job.after]
    assert len(chained) == pytest.approx(1000, rel=0.15)
    assert all(by_id[job.after[0]].user == job.user for job in chained)
    none = generate(seed=9, jobs=500, fail_rate=0, cancel_rate=0, after_rate=0)
    assert {job.outcome for job in none.jobs} == {"SUCCESS"}
    assert not any(job.after for job in none.jobs)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"jobs": 0}, "jobs must be 1 or more"),
    ({"heavy_users": 31}, "heavy users must be between 0"),
    ({"heavy_users": 0}, "needs at least one heavy user"),
    ({"heavy_share": 1.5}, "between 0 and 1"),
    ({"fail_rate": 0.7, "cancel_rate": 0.5}, "add up to more than 1"),
    ({"gpu_choices": ()}, "GPU choices"),
    ({"daily_amplitude": 2}, "daily amplitude"),
    ({"days": 0}, "days must be more than 0"),
])
def test_bad_parameters_say_what_to_fix(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        generate(**kwargs)  # type: ignore[arg-type]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sftq simulate")
    p.add_argument("--generate", metavar="FILE")
    add_generate_arguments(p)
    return p


def test_the_flags_reach_the_generator() -> None:
    args = parser().parse_args(["--generate", "t.csv", "--seed", "4", "--days", "1.5",
                                "--jobs", "40", "--users", "6", "--heavy-users", "1",
                                "--heavy-share", "0.25", "--gpu-choices", "2,4",
                                "--run-median-seconds", "600", "--run-sigma", "0.5",
                                "--daily-amplitude", "0.2", "--fail-rate", "0",
                                "--cancel-rate", "0", "--after-rate", "0"])
    trace = generate_from_args(args)
    assert trace == generate(seed=4, days=1.5, jobs=40, users=6, heavy_users=1,
                             heavy_share=0.25, gpu_choices=(2, 4), run_median_seconds=600,
                             run_sigma=0.5, daily_amplitude=0.2, fail_rate=0, cancel_rate=0,
                             after_rate=0)
    assert generate_command(args, "t.csv") == (
        "sftq simulate --generate t.csv --seed 4 --days 1.5 --jobs 40 --users 6 "
        "--heavy-users 1 --heavy-share 0.25 --gpu-choices 2,4 --run-median-seconds 600 "
        "--run-sigma 0.5 --daily-amplitude 0.2 --fail-rate 0 --cancel-rate 0 --after-rate 0")
    defaults = parser().parse_args(["--generate", "t.csv"])
    assert generate_command(defaults, "t.csv") == "sftq simulate --generate t.csv"
    assert generate_from_args(defaults) == generate()


def test_a_bad_gpu_list_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--gpu-choices", "1,two"])
    assert info.value.code == 2
    assert "write e.g. 1,2,4,8" in capsys.readouterr().err


def test_the_shipped_example_is_what_its_first_line_makes(tmp_path: Path) -> None:
    # examples/trace-small.csv starts with the command that made it; running it again must
    # give the same bytes, so the file and examples/README.md never drift from the generator.
    example = Path(__file__).resolve().parents[2] / "examples" / "trace-small.csv"
    first = example.read_text().splitlines()[0]
    assert first.startswith("# sftq simulate --generate examples/trace-small.csv ")
    argv = first.removeprefix("# sftq simulate ").split()
    args = parser().parse_args(argv)
    again = tmp_path / "trace-small.csv"
    write_trace(generate_from_args(args), again, comment=generate_command(args, args.generate))
    assert again.read_bytes() == example.read_bytes()
    trace = load_trace(example)
    assert len(trace.jobs) == 200 and len({job.user for job in trace.jobs}) == 8
    readme = (example.parent / "README.md").read_text()
    assert first.removeprefix("# ") in readme
