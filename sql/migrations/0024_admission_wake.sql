-- 0024: event-driven admission (issue 53, item 1). When the queue itself adds work or frees
-- room (a submit, a cancel, a job that ends), the transaction that does it also sets a
-- "wake requested" flag here; whoever fires ticks (the pg_net poke of cron/schedule_tick.sql,
-- `sftq ticker`) sees it and runs admission within about a second instead of at the next
-- periodic tick. The tick takes the flag just before it admits. docs/scheduling.md says how
-- each deployment is woken; sql/procedures/210_wake.sql holds the functions and triggers.

CREATE TABLE sftq.admission_wake (
    id            boolean PRIMARY KEY DEFAULT true CHECK (id),
    requested_at  timestamptz,
    requested_by  text,
    requests      bigint NOT NULL DEFAULT 0,
    pokes         bigint NOT NULL DEFAULT 0,
    taken_at      timestamptz
) WITH (fillfactor = 50);
INSERT INTO sftq.admission_wake (id) VALUES (true);
COMMENT ON TABLE sftq.admission_wake IS
    'One row: whether admission should run before the next periodic tick. Set (requested_at) by the transaction of a submit, a cancel or a job that ended, at its commit; taken (cleared) by the tick just before it admits. Read by whoever fires ticks (pg_net poke, sftq ticker).';
COMMENT ON COLUMN sftq.admission_wake.requested_at IS
    'When the oldest wake not yet taken by a tick was requested; NULL: no wake pending.';
COMMENT ON COLUMN sftq.admission_wake.requested_by IS
    'What requested it: submit, cancel, ended, or the reason a caller of sftq.request_admission_wake gave.';
COMMENT ON COLUMN sftq.admission_wake.requests IS
    'Wakes requested so far (one per pending period, however many events it coalesced).';
COMMENT ON COLUMN sftq.admission_wake.pokes IS
    'Bumped when a wake becomes pending and again when a tick ends with one pending: the Supabase poke trigger (cron/schedule_tick.sql) sends one POST to scheduler-tick per bump.';
COMMENT ON COLUMN sftq.admission_wake.taken_at IS 'When a tick last took a pending wake.';
