"""Traces: CSV and JSON lines, seconds and ISO times, external usage, `after`, and errors
that name the line, the column and what to fix (never a traceback)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sftq_server.simulate.trace import (
    ExternalUsage,
    Trace,
    TraceError,
    TraceJob,
    load_trace,
    write_trace,
)

HEADER = "id,submit_at,user,kind,gpu_count,run_seconds,outcome,outcome_at,after\n"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error(path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    return info.value


def test_csv_with_seconds_sorts_by_submit_then_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, "# made by hand\n" + HEADER +
                 "b,60,ana,dpo,2,120,,,\n"
                 "a,0,ana,SFT,1,3600,FAIL,30,\n"
                 "\n"
                 "c,60,ana,RFT,8,10.5,CANCELLED,,a;b\n")
    trace = load_trace(path)
    assert [job.id for job in trace.jobs] == ["a", "b", "c"]
    assert trace.jobs[0] == TraceJob(id="a", submit_at=0.0, user="ana", kind="SFT",
                                     gpu_count=1, run_seconds=3600.0, outcome="FAIL",
                                     outcome_at=30.0, after=())
    assert trace.jobs[1].kind == "DPO" and trace.jobs[1].outcome == "SUCCESS"
    assert trace.jobs[2].after == ("a", "b")
    assert trace.jobs[2].outcome == "CANCELLED" and trace.jobs[2].outcome_at is None
    assert trace.external == ()


def test_without_an_id_column_jobs_are_named_by_line(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_at,user,kind,gpu_count,run_seconds\n0,ana,SFT,1,60\n"
                           "5,bob,SFT,2,60\n")
    assert [job.id for job in load_trace(path).jobs] == ["L2", "L3"]


def test_iso_times_count_from_the_earliest_or_the_given_start(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_at,user,kind,gpu_count,run_seconds\n"
                           "2024-05-01T10:00:00Z,ana,SFT,1,60\n"
                           "2024-05-01T09:00:00+00:00,bob,SFT,1,60\n"
                           "2024-05-01T12:30:00+02:00,cy,SFT,1,60\n")
    trace = load_trace(path)
    assert [(job.user, job.submit_at) for job in trace.jobs] == [
        ("bob", 0.0), ("ana", 3600.0), ("cy", 5400.0)]
    started = load_trace(path, start=datetime(2024, 5, 1, 8, tzinfo=UTC))
    assert [job.submit_at for job in started.jobs] == [3600.0, 7200.0, 9000.0]
    with pytest.raises(TraceError, match="line 3, column 'submit_at'.*before the start"):
        load_trace(path, start=datetime(2024, 5, 1, 9, 30, tzinfo=UTC))


def test_jsonl_with_after_as_a_list_and_external_usage(tmp_path: Path) -> None:
    lines = [
        {"id": "p", "submit_at": 0, "user": "ana", "kind": "SFT", "gpu_count": 4,
         "run_seconds": 100},
        {"submit_at": 50, "kind": "EXTERNAL", "gpu_count": 16},
        {"id": "q", "submit_at": "2", "user": "ana", "kind": "RFT", "gpu_count": "2",
         "run_seconds": 10, "after": ["p"], "outcome": "cancelled", "outcome_at": 5},
        {"submit_at": 10, "kind": "external", "gpu_count": 0},
    ]
    path = write(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), "t.jsonl")
    trace = load_trace(path)
    assert [job.id for job in trace.jobs] == ["p", "q"]
    assert trace.jobs[1].after == ("p",) and trace.jobs[1].outcome_at == 5.0
    assert trace.external == (ExternalUsage(at=10.0, gpus=0), ExternalUsage(at=50.0, gpus=16))


def test_external_rows_in_csv_need_no_user_or_run(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + ",0,,EXTERNAL,8,,,,\n,0,ana,SFT,1,60,,,\n"
                                    ",3600,,EXTERNAL,2,,,,\n")
    trace = load_trace(path)
    assert trace.external == (ExternalUsage(0.0, 8), ExternalUsage(3600.0, 2))
    assert len(trace.jobs) == 1
    bad = write(tmp_path, HEADER + ",0,ana,SFT,1,60,,,\nx,5,,EXTERNAL,8,,,,\n", "x.csv")
    assert "line 3, column 'id'" in str(error(bad))


def test_the_format_is_sniffed_without_an_extension(tmp_path: Path) -> None:
    jsonl = write(tmp_path, '{"submit_at": 0, "user": "a", "kind": "SFT", "gpu_count": 1, '
                            '"run_seconds": 5}\n', "trace")
    assert load_trace(jsonl).jobs[0].user == "a"
    csv_file = write(tmp_path, "submit_at,user,kind,gpu_count,run_seconds\n0,b,SFT,1,5\n",
                     "trace.txt")
    assert load_trace(csv_file).jobs[0].user == "b"


@pytest.mark.parametrize(("body", "where", "says"), [
    ("0,ana,SFT,two,60\n", "line 2, column 'gpu_count'", "whole number"),
    ("0,ana,SFT,0,60\n", "line 2, column 'gpu_count'", "1 or more"),
    ("0,ana,SFT,1.5,60\n", "line 2, column 'gpu_count'", "whole number"),
    ("0,ana,XFT,1,60\n", "line 2, column 'kind'", "SFT, DPO, RFT"),
    ("0,,SFT,1,60\n", "line 2, column 'user'", "every job needs"),
    ("0,ana smith,SFT,1,60\n", "line 2, column 'user'", "letters, digits"),
    ("0,ana,SFT,1,-3\n", "line 2, column 'run_seconds'", "0 or more"),
    ("0,ana,SFT,1,0\n", "line 2, column 'run_seconds'", "more than 0"),
    ("0,ana,SFT,1,nan\n", "line 2, column 'run_seconds'", "finite"),
    ("yesterday,ana,SFT,1,60\n", "line 2, column 'submit_at'", "ISO 8601"),
    ("0,ana,SFT,1\n", "line 2", "4 fields where the header has 5"),
    ("0,ana,SFT,1,60\n2024-01-01T00:00:00,bob,SFT,1,60\n", "column 'submit_at'", "mixes"),
])
def test_bad_csv_lines_name_line_column_and_fix(tmp_path: Path, body: str, where: str,
                                                says: str) -> None:
    path = write(tmp_path, "submit_at,user,kind,gpu_count,run_seconds\n" + body)
    message = str(error(path))
    assert message.startswith(str(path))
    assert where in message and says in message


@pytest.mark.parametrize(("text", "where", "says"), [
    ("submit_at,user,kind,gpus,run_seconds\n", "line 1", "unknown column 'gpus'"),
    ("submit_at,user,kind,run_seconds\n0,a,SFT,5\n", "line 1", "lacks gpu_count"),
    ("", "t.csv", "empty"),
    ("submit_at,user,kind,gpu_count,run_seconds\n", "t.csv", "no jobs"),
    (HEADER + ",0,a,SFT,1,5,DONE,,\n", "line 2, column 'outcome'", "FAIL, CANCELLED"),
    (HEADER + ",0,a,SFT,1,5,,10,\n", "line 2, column 'outcome_at'", "outcome is SUCCESS"),
    (HEADER + "a,0,a,SFT,1,5,,,\na,1,a,SFT,1,5,,,\n", "line 3, column 'id'", "line 2"),
    (HEADER + "a,0,a,SFT,1,5,,,\nb,1,a,SFT,1,5,,,zz\n", "line 3, column 'after'",
     "'zz', which is no job's id"),
    (HEADER + "a,0,a,SFT,1,5,,,b\nb,1,a,SFT,1,5,,,\n", "line 2, column 'after'",
     "submitted after this job"),
    (HEADER + "a,0,a,SFT,1,5,,,a\n", "line 2, column 'after'", "cycle: a runs after a"),
    (HEADER + "a,0,a,SFT,1,5,,,c\nb,0,a,SFT,1,5,,,a\nc,0,a,SFT,1,5,,,b\n",
     "column 'after'", "cycle"),
    (HEADER + "a,0,a,SFT,1,5,,,\nb,1,a,SFT,1,5,,,a;;a\n", "line 3, column 'after'",
     "empty id"),
    (HEADER + ",0,,EXTERNAL,8,,,,\n", "t.csv", "only EXTERNAL rows"),
    (HEADER + "a,0,ana,SFT,1,5,,,\nb,1,bob,SFT,1,5,,,a\n", "line 3, column 'after'",
     "a job of 'ana'; a job can only run after its own user's jobs"),
    (HEADER + ",0,a,SFT,1,5,,," + ";".join(f"x{i}" for i in range(21)) + "\n",
     "line 2, column 'after'", "at most 20"),
    (HEADER + ",0,,EXTERNAL,-1,,,,\n,0,a,SFT,1,5,,,\n", "line 2, column 'gpu_count'",
     "0 or more"),
])
def test_bad_files_name_what_to_fix(tmp_path: Path, text: str, where: str, says: str) -> None:
    message = str(error(write(tmp_path, text)))
    assert where in message and says in message, message


@pytest.mark.parametrize(("line", "where", "says"), [
    ('{"submit_at": 0, "user": "a", "kind": "SFT", "gpu_count": 1, "run_seconds": 5',
     "line 1", "is not JSON at character"),
    ("[1, 2]", "line 1", "not an object"),
    ('{"submit_at": 0, "user": "a", "kind": "SFT", "gpu_count": true, "run_seconds": 5}',
     "line 1, column 'gpu_count'", "not a number"),
    ('{"submit_at": 0, "user": "a", "kind": "SFT", "gpus": 1, "run_seconds": 5}',
     "line 1", "unknown field 'gpus'"),
    ('{"submit_at": 0, "user": "a", "kind": "SFT", "gpu_count": 1, "run_seconds": 5, '
     '"after": {"x": 1}}', "line 1, column 'after'", "list of ids"),
    ('{"submit_at": 0, "user": ["a"], "kind": "SFT", "gpu_count": 1, "run_seconds": 5}',
     "line 1, column 'user'", "not text"),
])
def test_bad_jsonl_lines(tmp_path: Path, line: str, where: str, says: str) -> None:
    message = str(error(write(tmp_path, line + "\n", "t.jsonl")))
    assert where in message and says in message, message


def test_unreadable_files_are_trace_errors(tmp_path: Path) -> None:
    assert "no such file" in str(error(tmp_path / "missing.csv"))
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"submit_at,user\n\xff\xfe\x00")
    assert "UTF-8" in str(error(binary))


def test_a_long_after_chain_loads(tmp_path: Path) -> None:
    rows = ["j0,0,a,SFT,1,5,,,\n"] + [f"j{i},{i},a,SFT,1,5,,,j{i - 1}\n"
                                       for i in range(1, 5000)]
    trace = load_trace(write(tmp_path, HEADER + "".join(rows)))
    assert trace.jobs[-1].after == ("j4998",)


@pytest.mark.parametrize("name", ["out.csv", "out.jsonl"])
def test_write_then_load_gives_the_same_trace(tmp_path: Path, name: str) -> None:
    trace = Trace(
        jobs=(
            TraceJob("a", 0.0, "ana", "SFT", 1, 3600.0),
            TraceJob("d", 1.0, "bob.jr@x", "SFT", 2, 7.0),
            TraceJob("b,2", 12.5, "ana", "DPO", 8, 0.25, "FAIL", 3.0),
            TraceJob("c", 12.5, "ana", "RFT", 2, 60.0, "CANCELLED", None, ("a", "b,2")),
        ),
        external=(ExternalUsage(0.0, 4), ExternalUsage(7200.0, 0)),
    )
    path = tmp_path / name
    write_trace(trace, path, comment="made by a test\nsecond line")
    assert path.read_text().startswith("# made by a test\n# second line\n")
    assert load_trace(path) == trace


# -- docs/simulate.md's conversions of public traces, run as written -----------------------
PHILLY_JOBS = [
    {"status": "Pass", "vc": "ee9e8c", "jobid": "application_1506638472019_14199",
     "attempts": [
         {"start_time": "2017-10-07 01:12:09", "end_time": "2017-10-07 01:13:23",
          "detail": [{"ip": "m47", "gpus": [f"gpu{i}" for i in range(8)]}]},
         {"start_time": "2017-10-07 01:13:30", "end_time": "2017-10-09 06:53:12",
          "detail": [{"ip": "m412", "gpus": [f"gpu{i}" for i in range(8)]}]}],
     "submitted_time": "2017-10-07 01:11:39", "user": "ce2f4c"},
    {"status": "Killed", "vc": "ee9e8c", "jobid": "application_1_2",
     "attempts": [{"start_time": "2017-10-02 10:00:00", "end_time": "2017-10-02 11:00:00",
                   "detail": [{"ip": "m1", "gpus": ["gpu0"]}, {"ip": "m2", "gpus": ["gpu3"]}]}],
     "submitted_time": "2017-10-02 09:30:00", "user": "ab12cd"},
    {"status": "Failed", "vc": "x", "jobid": "application_1_3",
     "attempts": [{"start_time": "2017-10-03 00:00:10", "end_time": "2017-10-03 00:05:10",
                   "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}],
     "submitted_time": "2017-10-03 00:00:00", "user": "ab12cd"},
    # Left out: never ran; still running when cut; outside the week; no GPUs.
    {"status": "Killed", "vc": "x", "jobid": "application_1_4", "attempts": [],
     "submitted_time": "2017-10-03 00:00:00", "user": "ab12cd"},
    {"status": "Pass", "vc": "x", "jobid": "application_1_5",
     "attempts": [{"start_time": "2017-10-03 00:00:10", "end_time": None,
                   "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}],
     "submitted_time": "2017-10-03 00:00:00", "user": "ab12cd"},
    {"status": "Pass", "vc": "x", "jobid": "application_1_6",
     "attempts": [{"start_time": "2017-10-12 00:00:10", "end_time": "2017-10-12 01:00:00",
                   "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}],
     "submitted_time": "2017-10-12 00:00:00", "user": "ab12cd"},
    {"status": "Pass", "vc": "x", "jobid": "application_1_7",
     "attempts": [{"start_time": "2017-10-04 00:00:10", "end_time": "2017-10-04 01:00:00",
                   "detail": [{"ip": "m1", "gpus": []}]}],
     "submitted_time": "2017-10-04 00:00:00", "user": "ab12cd"},
]

ACME_COLUMNS = ("job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,"
                "end_time,duration,queue,gpu_time")
ACME_ROWS = [  # (job_id, user, gpu_num, state, submit, start, end, duration)
    ("5778432", "u5907", 8, "FAILED", "03-06 00:18:22", "03-06 00:18:54", "03-06 00:20:51", 117),
    ("5778469", "u5907", 8, "COMPLETED", "03-06 00:23:58", "03-06 00:24:11", "03-06 01:09:04",
     2693),
    ("5778470", "u1a2b", 2, "CANCELLED", "03-07 10:00:00", "03-07 10:10:00", "03-07 10:40:00",
     1800),
    ("5778471", "u1a2b", 4, "TIMEOUT", "03-08 10:00:00", "03-08 10:00:00", "03-08 11:00:00", 3600),
    # Left out: a CPU job; a job before the week.
    ("5778472", "u1a2b", 0, "COMPLETED", "03-08 10:00:00", "03-08 10:00:00", "03-08 11:00:00",
     3600),
    ("5778473", "u1a2b", 1, "COMPLETED", "03-01 10:00:00", "03-01 10:00:00", "03-01 11:00:00",
     3600),
]
ACME_SEREN = ACME_COLUMNS + "\n" + "".join(
    f"{job},{user},1,{gpus},16,Other,{state},2023-{submit}+08:00,2023-{begin}+08:00,"
    f"2023-{end}+08:00,{duration},0,{gpus * duration}\n"
    for job, user, gpus, state, submit, begin, end, duration in ACME_ROWS)


def test_the_docs_conversions_of_philly_and_acme_work_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulate.md").read_text()
    blocks = [block.split("```", 1)[0] for block in doc.split("```python\n")[1:]]
    assert len(blocks) == 4
    (tmp_path / "trace-data").mkdir()
    (tmp_path / "trace-data" / "cluster_job_log").write_text(json.dumps(PHILLY_JOBS))
    (tmp_path / "data" / "job_trace").mkdir(parents=True)
    (tmp_path / "data" / "job_trace" / "trace_seren.csv").write_text(ACME_SEREN)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/simulate.md", "exec"), namespace)

    philly = load_trace(tmp_path / "philly-week.csv")
    assert [(j.id, j.submit_at, j.user, j.gpu_count, j.run_seconds, j.outcome, j.outcome_at)
            for j in philly.jobs] == [
        ("application_1_2", 9.5 * 3600, "ab12cd", 2, 3600.0, "CANCELLED", 5400.0),
        ("application_1_3", 86400.0, "ab12cd", 1, 300.0, "FAIL", None),
        ("application_1506638472019_14199", 5 * 86400 + 3600 + 11 * 60 + 39, "ce2f4c", 8,
         (2 * 86400 + 5 * 3600 + 41 * 60 + 3), "SUCCESS", None),
    ]
    seren = load_trace(tmp_path / "seren-week.csv")
    assert [(j.id, j.submit_at, j.user, j.gpu_count, j.run_seconds, j.outcome, j.outcome_at)
            for j in seren.jobs] == [
        ("5778432", 18 * 60 + 22, "u5907", 8, 117.0, "FAIL", None),
        ("5778469", 23 * 60 + 58, "u5907", 8, 2693.0, "SUCCESS", None),
        ("5778470", 86400 + 10 * 3600, "u1a2b", 2, 1800.0, "CANCELLED", 2400.0),
        ("5778471", 2 * 86400 + 10 * 3600, "u1a2b", 4, 3600.0, "FAIL", None),
    ]
