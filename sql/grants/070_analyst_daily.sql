-- analyst_daily's rollup (sql/procedures/160_analyst_daily.sql). Runs after 010_roles.sql,
-- which revokes everything first. The analyst reads the rollup only through the view (its
-- owner's rights), and calls the function the view calls (a function in a view runs with the
-- rights of whoever reads the view). sftq._transition runs as its caller: the scheduler's
-- transitions read the rollup's horizon and log the moves of rolled-up days' jobs (the api_*
-- functions run as their owner).
GRANT SELECT ON sftq.daily_rollup_state TO sftq_scheduler;
GRANT INSERT ON sftq.daily_rollup_moves TO sftq_scheduler;
GRANT EXECUTE ON FUNCTION sftq.analyst_daily_split_hours() TO sftq_analyst;

-- The tick refreshes the rollup through a trigger on its own record (SECURITY DEFINER): no
-- role calls sftq.daily_rollup_refresh itself.
