"""Synthetic traces: `sftq simulate --generate FILE`.

The shape follows what published GPU-cluster traces show (Philly, Helios, Acme): arrivals
that follow the working day, run times spread over orders of magnitude (log-normal), and a
few users who submit most of the work while many submit a little. Every number is a
parameter, and the same parameters with the same seed give the same trace, byte for byte.

- Arrivals: a Poisson process whose rate follows the day, `1 + daily_amplitude *
  cos(2 pi (t - 15:00) / 24 h)` (busiest at 15:00, quietest at 03:00 of each virtual day).
  The trace has exactly `jobs` jobs: given their number, the arrival times of a Poisson
  process are independent draws from its rate's shape, which is how they are drawn here.
- Users: `heavy_users` users share `heavy_share` of the jobs evenly; the other users share
  the rest unevenly (log-normal weights), each with at least one job when there are enough.
- GPUs: one of `gpu_choices`, the smaller the likelier (weight 1/g); kinds: 70% SFT, 20% DPO,
  10% RFT.
- Run time: log-normal with median `run_median_seconds` and shape `run_sigma`, whole seconds,
  at least 60.
- Outcomes: `fail_rate` of the jobs FAIL part-way through their run (the run is cut to
  5-100% of its draw); `cancel_rate` are CANCELLED by their user after an exponential time
  whose mean is the job's run time (so some while waiting, some while running).
- Pipelines: `after_rate` of the jobs run after their user's previous job.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from sftq_server.simulate.trace import Trace, TraceJob

DAY = 86_400.0
PEAK_SECONDS = 15 * 3600.0
KINDS = ("SFT", "DPO", "RFT")
KIND_WEIGHTS = (0.7, 0.2, 0.1)
MIN_RUN_SECONDS = 60


def generate(*, seed: int = 1, days: float = 7, jobs: int = 5000, users: int = 30,
             heavy_users: int = 3, heavy_share: float = 0.5,
             gpu_choices: Sequence[int] = (1, 2, 4, 8), run_median_seconds: float = 3600,
             run_sigma: float = 1.0, daily_amplitude: float = 0.6, fail_rate: float = 0.05,
             cancel_rate: float = 0.03, after_rate: float = 0.05) -> Trace:
    """A synthetic trace (see the module's docstring); raises ValueError for bad parameters."""
    _check(days=days, jobs=jobs, users=users, heavy_users=heavy_users, heavy_share=heavy_share,
           gpu_choices=gpu_choices, run_median_seconds=run_median_seconds, run_sigma=run_sigma,
           daily_amplitude=daily_amplitude, fail_rate=fail_rate, cancel_rate=cancel_rate,
           after_rate=after_rate)
    rng = random.Random(seed)
    span = days * DAY
    times = sorted(float(math.floor(_arrival(rng, span, daily_amplitude))) for _ in range(jobs))
    owners = _owners(rng, jobs, users, heavy_users, heavy_share)
    gpu_weights = [1 / g for g in gpu_choices]
    width = len(str(jobs))
    last_of: dict[str, str] = {}
    out: list[TraceJob] = []
    for index, (at, user) in enumerate(zip(times, owners, strict=True)):
        job_id = f"j{index + 1:0{width}d}"
        run = max(MIN_RUN_SECONDS,
                  round(run_median_seconds * math.exp(run_sigma * rng.gauss(0.0, 1.0))))
        draw = rng.random()
        outcome, outcome_at = "SUCCESS", None
        if draw < fail_rate:
            outcome = "FAIL"
            run = max(MIN_RUN_SECONDS, round(run * rng.uniform(0.05, 1.0)))
        elif draw < fail_rate + cancel_rate:
            outcome = "CANCELLED"
            outcome_at = float(max(1, round(rng.expovariate(1 / run))))
        after: tuple[str, ...] = ()
        if user in last_of and rng.random() < after_rate:
            after = (last_of[user],)
        last_of[user] = job_id
        out.append(TraceJob(
            id=job_id, submit_at=at, user=user,
            kind=rng.choices(KINDS, weights=KIND_WEIGHTS)[0],
            gpu_count=rng.choices(list(gpu_choices), weights=gpu_weights)[0],
            run_seconds=float(run), outcome=outcome, outcome_at=outcome_at, after=after,
        ))
    return Trace(jobs=tuple(out), external=())


def _arrival(rng: random.Random, span: float, amplitude: float) -> float:
    """One arrival time in [0, span) drawn from the daily rate's shape (by rejection)."""
    while True:
        t = rng.uniform(0.0, span)
        rate = 1 + amplitude * math.cos(2 * math.pi * (t - PEAK_SECONDS) / DAY)
        if rng.uniform(0.0, 1 + amplitude) <= rate:
            return t


def _owners(rng: random.Random, jobs: int, users: int, heavy_users: int,
            heavy_share: float) -> list[str]:
    heavy = [f"heavy{i + 1}" for i in range(heavy_users)]
    light_count = users - heavy_users
    light = [f"light{i + 1:0{len(str(light_count))}d}" for i in range(light_count)]
    n_heavy = round(jobs * heavy_share) if light else jobs
    if not heavy:
        n_heavy = 0
    owners = [heavy[i % len(heavy)] for i in range(n_heavy)]
    n_light = jobs - n_heavy
    if light and n_light:
        weights = [rng.lognormvariate(0.0, 0.5) for _ in light]
        first = light[:n_light]  # everyone once, while there are jobs for it
        owners += first + rng.choices(light, weights=weights, k=n_light - len(first))
    rng.shuffle(owners)
    return owners


def _check(*, days: float, jobs: int, users: int, heavy_users: int, heavy_share: float,
           gpu_choices: Sequence[int], run_median_seconds: float, run_sigma: float,
           daily_amplitude: float, fail_rate: float, cancel_rate: float,
           after_rate: float) -> None:
    problems = []
    if not (days > 0 and math.isfinite(days)):
        problems.append("days must be more than 0")
    if jobs < 1:
        problems.append("jobs must be 1 or more")
    if users < 1:
        problems.append("users must be 1 or more")
    if not 0 <= heavy_users <= users:
        problems.append(f"heavy users must be between 0 and the number of users ({users})")
    if not 0 <= heavy_share <= 1:
        problems.append("the heavy share must be between 0 and 1")
    elif heavy_users == 0 and heavy_share > 0:
        problems.append("a heavy share needs at least one heavy user (or set the share to 0)")
    elif heavy_users == users and heavy_share < 1:
        problems.append("with every user heavy, the heavy share must be 1 (or fewer heavy users)")
    if not gpu_choices or any(g < 1 for g in gpu_choices):
        problems.append("GPU choices must be whole numbers of 1 or more")
    if not run_median_seconds > 0:
        problems.append("the median run must be more than 0 seconds")
    if not run_sigma >= 0:
        problems.append("the run sigma must be 0 or more")
    if not 0 <= daily_amplitude <= 1:
        problems.append("the daily amplitude must be between 0 and 1")
    for name, rate in (("fail", fail_rate), ("cancel", cancel_rate), ("after", after_rate)):
        if not 0 <= rate <= 1:
            problems.append(f"the {name} rate must be between 0 and 1")
    if fail_rate + cancel_rate > 1:
        problems.append("the fail and cancel rates add up to more than 1")
    if problems:
        raise ValueError("; ".join(problems))


# -- the command line (`sftq simulate --generate FILE`) ----------------------------------
def _gpu_list(value: str) -> tuple[int, ...]:
    try:
        choices = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a list of GPU counts; write e.g. 1,2,4,8") from None
    if not choices or any(c < 1 for c in choices):
        raise argparse.ArgumentTypeError("GPU counts are whole numbers of 1 or more, e.g. 1,2,4,8")
    return choices


FLAGS: tuple[tuple[str, Callable[[str], Any], object, str], ...] = (
    ("seed", int, 1, "random seed: the same seed and flags give the same file"),
    ("days", float, 7.0, "length of the trace in days"),
    ("jobs", int, 5000, "number of jobs"),
    ("users", int, 30, "number of users (heavy ones included)"),
    ("heavy_users", int, 3, "users who submit the heavy share"),
    ("heavy_share", float, 0.5, "share of the jobs the heavy users submit (0-1)"),
    ("gpu_choices", _gpu_list, (1, 2, 4, 8), "GPU counts a job may ask for, smaller likelier"),
    ("run_median_seconds", float, 3600.0, "median run time (log-normal)"),
    ("run_sigma", float, 1.0, "spread of run times (log-normal sigma)"),
    ("daily_amplitude", float, 0.6, "daily cycle: 0 flat, 1 no arrivals at 03:00"),
    ("fail_rate", float, 0.05, "share of jobs that FAIL part-way through their run"),
    ("cancel_rate", float, 0.03, "share of jobs their user CANCELs"),
    ("after_rate", float, 0.05, "share of jobs that run after their user's previous job"),
)


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    """The generator's flags, in a group of their own (they matter only with --generate)."""
    group = parser.add_argument_group("synthetic trace (with --generate FILE)")
    for name, kind, default, text in FLAGS:
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument("--" + name.replace("_", "-"), dest="gen_" + name, type=kind,
                           default=default, metavar=name.split("_")[-1].upper(),
                           help=f"{text} (default: {shown})")


def generate_from_args(args: argparse.Namespace) -> Trace:
    """The trace the parsed flags ask for; ValueError (with what to fix) for bad values."""
    return generate(**{name: getattr(args, "gen_" + name) for name, *_ in FLAGS})


def generate_command(args: argparse.Namespace, path: str) -> str:
    """The command that makes this trace again, for the file's first (comment) line."""
    parts = ["sftq simulate --generate", path]
    for name, _, default, _text in FLAGS:
        value = getattr(args, "gen_" + name)
        if value != default:
            if isinstance(value, tuple):
                shown = ",".join(map(str, value))
            else:
                shown = format(value, "g") if isinstance(value, float) else str(value)
            parts.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(parts)
