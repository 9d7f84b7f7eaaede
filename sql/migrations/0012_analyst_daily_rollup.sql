-- 0012: what sftq.analyst_daily reads instead of grouping every job of the history at each
-- query: jobs and GPU hours per UTC day (and hour) of the days that are over, kind and
-- state, kept exact by a log of the state changes made to those jobs since.
-- sql/procedures/160_analyst_daily.sql maintains them (at the end of each tick);
-- sftq._transition writes the log.

-- Per (UTC day, kind, state) and per (UTC hour, kind, state): jobs and GPU hours of every UTC
-- day before daily_rollup_state.rolled_through, as of the last time the tick folded the
-- moves in. A session in UTC (or in any zone on a day that is a UTC day) reads the days; a
-- session in a zone a whole number of hours away from UTC reads the hours.
CREATE TABLE sftq.daily_rollup (
    day        timestamptz NOT NULL,
    kind       text NOT NULL,
    state      text NOT NULL,
    jobs       bigint NOT NULL,
    gpu_hours  numeric,
    PRIMARY KEY (day, kind, state)
);
COMMENT ON TABLE sftq.daily_rollup IS
    'Jobs and GPU hours per UTC day of enqueue (day: its UTC midnight), kind and state, for the UTC days before daily_rollup_state.rolled_through. With the rows of daily_rollup_moves, it is what sftq.analyst_daily shows for those days. gpu_hours is null when no job of the group has ended after running, as the sum in the view.';

CREATE TABLE sftq.daily_rollup_hours (
    day        timestamptz NOT NULL,
    hour       timestamptz NOT NULL,
    kind       text NOT NULL,
    state      text NOT NULL,
    jobs       bigint NOT NULL,
    gpu_hours  numeric,
    PRIMARY KEY (day, hour, kind, state),
    CHECK (day = date_trunc('day', hour, 'UTC'))
);
COMMENT ON TABLE sftq.daily_rollup_hours IS
    'sftq.daily_rollup per UTC hour of enqueue (hour: its start; day: its UTC midnight, which leads the key), for sessions whose days are not UTC days.';

-- A job of a rolled-up day changed state: one row per transition (sftq._transition), folded
-- into the rollup and deleted by the next tick. A log, not a dirty flag: the tick adds
-- what moved instead of counting the day again, and readers add the rows not folded yet.
CREATE TABLE sftq.daily_rollup_moves (
    hour        timestamptz NOT NULL,
    kind        text NOT NULL,
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    gpu_hours   numeric
);
COMMENT ON TABLE sftq.daily_rollup_moves IS
    'State changes of jobs created before daily_rollup_state.moves_before, not yet folded into daily_rollup and daily_rollup_hours: the job (created in the UTC hour starting at hour) left (hour, kind, from_state) and joined (hour, kind, to_state) with gpu_hours (its GPU hours in the new state; it had none in the old one, which was QUEUED or PROGRESS).';

CREATE TABLE sftq.daily_rollup_state (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    moves_before    timestamptz NOT NULL DEFAULT '-infinity',
    rolled_from     timestamptz,
    rolled_through  timestamptz NOT NULL DEFAULT '-infinity',
    CHECK (rolled_through <= moves_before),
    CHECK (rolled_from <= rolled_through)
);
INSERT INTO sftq.daily_rollup_state DEFAULT VALUES;
ANALYZE sftq.daily_rollup_state;  -- one row: plans that read it must not take it for 1,800
COMMENT ON TABLE sftq.daily_rollup_state IS
    'One row. moves_before: a UTC midnight; a state change of a job created before it is logged in daily_rollup_moves, and no job can be enqueued before it any more (moved on under the exclusive admission gate). rolled_from, rolled_through: the UTC days from the first to before the second are in daily_rollup and daily_rollup_hours (no job is older than rolled_from); analyst_daily counts the jobs from rolled_through on one by one.';

-- analyst_daily counts the jobs of the days not rolled up yet (today) one by one, and the tick
-- rolls up a day once it is over: both read a range of created_at. jobs grow in created_at
-- order, so a BRIN index (a few pages, no btree on the insert path) finds that range.
CREATE INDEX jobs_created_brin_idx ON sftq.jobs USING brin (created_at);
