-- Creates, or brings up to date, one login role that belongs to one sftq group role
-- (sftq_api or sftq_analyst). The group roles come from the migrations and own nothing;
-- the login role owns nothing either: it only inherits what its group was granted.
--
-- Run by `infra/deploy.sh db` with psql variables:
--   login              the login role, e.g. sftq_api_login
--   member_of          sftq_api | sftq_analyst | sftq_scheduler
--   password           its password (stored by the server as a SCRAM verifier)
--   statement_timeout  a per-role ceiling on any one statement, e.g. 30s
-- Safe to run again: an existing role gets the new password and settings.

BEGIN;

SELECT format(CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = :'login')
                   THEN 'ALTER ROLE %I WITH LOGIN INHERIT PASSWORD %L'
                   ELSE 'CREATE ROLE %I WITH LOGIN INHERIT PASSWORD %L' END,
              :'login', :'password')
\gexec

SELECT format('GRANT %I TO %I', :'member_of', :'login')
\gexec

SELECT format('ALTER ROLE %I SET statement_timeout = %L', :'login', :'statement_timeout')
\gexec

COMMIT;
