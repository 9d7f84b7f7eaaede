#!/usr/bin/env bash
# Deploys finetune-queue for real: the queue database on a Supabase project, the three
# HTTP functions on Cloud Run functions with their secrets in Secret Manager, and the
# pg_cron job that fires the scheduler tick. docs/operations.md explains each step.
#
# Every command it runs goes through `run`, which first prints it, one line, shell-quoted,
# with secrets shown as ***. With --dry-run it prints them and runs nothing (it still
# stages the functions' source folders locally, so that what would be uploaded can be
# inspected). Commands are printed relative to the repository root, where the script runs.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: infra/deploy.sh [--dry-run] [--only NAMES] STEP...

Steps (run in the order given; `all` = db secrets functions cron):
  db          apply migrations to SUPABASE_DB_URL; create the login roles asked for
  secrets     store the functions' secrets in Secret Manager (a new version each run)
  functions   stage and deploy jobs-api, analytics and scheduler-tick (gen2, python311)
  cron        schedule the 30-second tick with pg_cron (running it again replaces the job)
  unschedule  remove the tick's pg_cron job
  all         db, secrets, functions, cron

Options:
  -n, --dry-run  print the exact commands, one per line, secrets masked; run nothing
  --only NAMES   with a single `secrets` or `functions` step: only these (comma-separated)
                 secrets: database-url, api-database-url, analytics-database-url,
                          fireworks-api-key, tick-secret
                 functions: jobs-api, analytics, scheduler-tick

Settings (environment variables):
  SUPABASE_DB_URL           direct or session connection, port 5432 (db, cron, unschedule)
  SUPABASE_POOLER_URL       transaction pooler, port 6543, as the owner role (secrets)
  SFTQ_API_DB_PASSWORD      db: create/update login role sftq_api_login (member of sftq_api);
                            secrets: derive the API functions' DATABASE_URL from the pooler URL
  SFTQ_API_DATABASE_URL     secrets: the API functions' DATABASE_URL, instead of deriving it
  SFTQ_ANALYST_DB_PASSWORD  db: create/update login role sftq_analyst_login (member of sftq_analyst)
  SFTQ_API_LOGIN_ROLE, SFTQ_ANALYST_LOGIN_ROLE   login role names (defaults above)
  ANALYTICS_DATABASE_URL    secrets: DATABASE_URL of the analytics function (default: the API's)
  FIREWORKS_API_KEY         secrets
  SFTQ_TICK_SECRET          secrets, cron: the bearer secret scheduler-tick requires
  GCP_PROJECT, GCP_REGION   secrets (project), functions, cron (to derive the tick URL)
  GCP_SERVICE_ACCOUNT       optional: runtime identity of the functions, granted access to the secrets
  FIREWORKS_ACCOUNT_ID      functions
  SFTQ_TICK_URL             cron: the tick URL (default https://REGION-PROJECT.cloudfunctions.net/scheduler-tick)
  Passed to the functions when set: FIREWORKS_BASE_URL FIREWORKS_QUOTA_ID FIREWORKS_TIMEOUT
    SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_LEASE_SECONDS SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS
    SFTQ_MAX_BODY_BYTES SFTQ_QUEUE_TIMEOUT_SECONDS SFTQ_SUBMIT_MAX_ATTEMPTS SFTQ_SUBMIT_MAX_SECONDS
    SFTQ_SUBMIT_BACKOFF_SECONDS SFTQ_RECONCILE_GET_LIMIT
  SFTQ_SECRET_PREFIX        Secret Manager names are PREFIX + short name (default sftq-)
  SFTQ_BUILD_DIR            where functions are staged (default: a new temporary folder)
  SFTQ_FUNCTIONS_DIR        the functions' source (default functions)
  SFTQ_PYTHON               the Python whose installed versions pin requirements.txt (default python3)
  SFTQ_BIN, PSQL, GCLOUD    the commands to use (default sftq, psql, gcloud)
EOF
}

CALLER_PWD=$PWD
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PROG=infra/deploy.sh
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# ---- printing and running ---------------------------------------------------------------

DRY_RUN=0
MASK=()  # values that are never printed, longest first (so no part of one is left showing)

mask() {
    local v m sorted
    for v in "$@"; do
        [[ -n $v ]] || continue
        sorted=()
        for m in "${MASK[@]}"; do
            if [[ -n $v && ${#v} -gt ${#m} ]]; then sorted+=("$v"); v=''; fi
            sorted+=("$m")
        done
        if [[ -n $v ]]; then sorted+=("$v"); fi
        MASK=("${sorted[@]}")
    done
}

# POSIX shell quoting, the same as Python's shlex.quote.
quote() {
    local s=$1 q="'\"'\"'"
    if [[ -z $s ]]; then
        printf "''"
    elif [[ $s =~ ^[A-Za-z0-9@%+=:,./_-]+$ ]]; then
        printf '%s' "$s"
    else
        printf "'%s'" "${s//\'/$q}"
    fi
}

# One command as printed: each word with secrets replaced by ***, then quoted.
render() {
    local out=() w m
    for w in "$@"; do
        for m in "${MASK[@]}"; do w=${w//"$m"/"***"}; done
        out+=("$(quote "$w")")
    done
    printf '%s' "${out[*]}"
}

run() {
    printf '%s\n' "$(render "$@")"
    if ((!DRY_RUN)); then "$@"; fi
}

# run_with_input VALUE CMD...: VALUE goes to CMD's stdin, never onto a command line.
run_with_input() {
    local input=$1
    shift
    printf '%s | %s\n' "$(render printf %s "$input")" "$(render "$@")"
    if ((!DRY_RUN)); then printf %s "$input" | "$@"; fi
}

# run_unless CHECK... -- CMD...: CMD only when CHECK fails.
run_unless() {
    local check=()
    while [[ $1 != -- ]]; do check+=("$1"); shift; done
    shift
    printf '%s >/dev/null 2>&1 || %s\n' "$(render "${check[@]}")" "$(render "$@")"
    if ((!DRY_RUN)); then "${check[@]}" >/dev/null 2>&1 || "$@"; fi
}

# ---- settings ---------------------------------------------------------------------------

MISSING=()
need() {  # need VAR "what it is": collect, so one error lists everything missing
    local m
    [[ -z ${!1:-} ]] || return 0
    for m in "${MISSING[@]}"; do [[ $m != "  $1:"* ]] || return 0; done
    MISSING+=("  $1: $2")
}

need_tool() {
    if ((!DRY_RUN)) && ! command -v "$1" >/dev/null 2>&1; then
        MISSING+=("  the command \`$1\` ($2) is not on PATH")
    fi
}

need_file() {  # a file a real run reads (a dry run only names it)
    if ((!DRY_RUN)) && [[ ! -f $1 ]]; then MISSING+=("  $1 does not exist"); fi
}

# postgres[ql]://user[:password]@host[:port][/db][?params]; sets U_SCHEME U_USER U_PASS U_HOSTPART U_PORT.
URL_RE='^(postgres(ql)?://)([^:@/?]+)(:([^@]*))?@(([^:/?]+)(:([0-9]+))?([/?].*)?)$'
parse_url() {  # parse_url VAR
    local url=${!1}
    [[ $url =~ $URL_RE ]] ||
        die "$1 must look like postgresql://USER:PASSWORD@HOST:PORT/DBNAME (a URL, with the user in it)"
    U_SCHEME=${BASH_REMATCH[1]} U_USER=${BASH_REMATCH[3]} U_PASS=${BASH_REMATCH[5]}
    U_HOSTPART=${BASH_REMATCH[6]} U_PORT=${BASH_REMATCH[9]:-5432}
    mask "$U_PASS"
}

urlencode() {  # percent-encode every byte outside the unreserved set
    local LC_ALL=C s=$1 enc='' c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
            [A-Za-z0-9._~-]) enc+=$c ;;
            *) printf -v c '%%%02X' "'$c"; enc+=$c ;;
        esac
    done
    printf '%s' "$enc"
}

from_caller() {  # a path the caller gave, relative to where they ran the script
    case $1 in
        /*) printf '%s' "$1" ;;
        *) printf '%s/%s' "$CALLER_PWD" "$1" ;;
    esac
}

SQFX=${SFTQ_SECRET_PREFIX:-sftq-}
SFTQ_BIN=${SFTQ_BIN:-sftq}
PSQL=${PSQL:-psql}
GCLOUD=${GCLOUD:-gcloud}
PYTHON=${SFTQ_PYTHON:-python3}
FUNCTIONS_DIR=functions
if [[ -n ${SFTQ_FUNCTIONS_DIR:-} ]]; then FUNCTIONS_DIR=$(from_caller "$SFTQ_FUNCTIONS_DIR"); fi
API_LOGIN=${SFTQ_API_LOGIN_ROLE:-sftq_api_login}
ANALYST_LOGIN=${SFTQ_ANALYST_LOGIN_ROLE:-sftq_analyst_login}
ALL_SECRETS=(database-url api-database-url analytics-database-url fireworks-api-key tick-secret)
ALL_FUNCTIONS=(jobs-api analytics scheduler-tick)

check_db_url() {  # the migrator and pg_cron need a real session: not the transaction pooler
    need SUPABASE_DB_URL "the project's direct connection (Settings > Database > Connection string > Direct, port 5432)"
    if [[ -n ${SUPABASE_DB_URL:-} ]]; then
        parse_url SUPABASE_DB_URL
        if [[ $U_PORT == 6543 ]]; then
            die "SUPABASE_DB_URL points at the transaction pooler (port 6543): migrations, roles and pg_cron need the direct connection or the session pooler (port 5432)"
        fi
    fi
}

check_login_password() {  # check_login_password VAR ROLE
    local pw=${!1:-}
    [[ -z $pw ]] && return 0
    [[ ${#pw} -ge 16 ]] || die "$1 is shorter than 16 characters; generate one, e.g. openssl rand -hex 24"
    [[ $2 =~ ^[a-z_][a-z0-9_]*$ ]] || die "login role name '$2' must be lower case letters, digits and _"
    mask "$pw"
}

check_db() {
    check_db_url
    check_login_password SFTQ_API_DB_PASSWORD "$API_LOGIN"
    check_login_password SFTQ_ANALYST_DB_PASSWORD "$ANALYST_LOGIN"
    need_tool "$SFTQ_BIN" "the sftq CLI: pip install -e '.[server]'"
    if [[ -n ${SFTQ_API_DB_PASSWORD:-}${SFTQ_ANALYST_DB_PASSWORD:-} ]]; then
        need_tool "$PSQL" "the PostgreSQL client"
    fi
}

selected() {  # selected NAME: is NAME in --only (or is there no --only)?
    [[ -z $ONLY ]] || [[ ",$ONLY," == *",$1,"* ]]
}

# Each secret's value, filled by check_secrets.
declare -A SECRET_VALUE=()

api_database_url() {
    if [[ -n ${SFTQ_API_DATABASE_URL:-} ]]; then
        parse_url SFTQ_API_DATABASE_URL
        SECRET_VALUE[api-database-url]=$SFTQ_API_DATABASE_URL
        return
    fi
    need SFTQ_API_DB_PASSWORD "the password of login role $API_LOGIN (or set SFTQ_API_DATABASE_URL); jobs-api and analytics never connect as the owner"
    need SUPABASE_POOLER_URL "the project's transaction pooler URL (port 6543)"
    [[ -n ${SFTQ_API_DB_PASSWORD:-} && -n ${SUPABASE_POOLER_URL:-} ]] || return 0
    check_login_password SFTQ_API_DB_PASSWORD "$API_LOGIN"
    parse_url SUPABASE_POOLER_URL
    # Supavisor names users ROLE.PROJECT_REF: keep the pooler user's suffix.
    local suffix='' encoded
    [[ $U_USER == *.* ]] && suffix=.${U_USER#*.}
    encoded=$(urlencode "$SFTQ_API_DB_PASSWORD")
    mask "$encoded"
    SECRET_VALUE[api-database-url]=$U_SCHEME$API_LOGIN$suffix:$encoded@$U_HOSTPART
}

check_secrets() {
    need GCP_PROJECT "the Google Cloud project id"
    need_tool "$GCLOUD" "the Google Cloud CLI"
    if selected database-url; then
        need SUPABASE_POOLER_URL "the project's transaction pooler URL (port 6543), as the owner role, for scheduler-tick"
        if [[ -n ${SUPABASE_POOLER_URL:-} ]]; then
            parse_url SUPABASE_POOLER_URL
            if [[ $U_PORT != 6543 ]]; then
                note "warning: SUPABASE_POOLER_URL uses port $U_PORT; Supabase's transaction pooler is 6543"
            fi
            SECRET_VALUE[database-url]=$SUPABASE_POOLER_URL
        fi
    fi
    if selected api-database-url || selected analytics-database-url; then
        api_database_url
    fi
    if selected analytics-database-url; then
        if [[ -n ${ANALYTICS_DATABASE_URL:-} ]]; then
            parse_url ANALYTICS_DATABASE_URL
            SECRET_VALUE[analytics-database-url]=$ANALYTICS_DATABASE_URL
        elif [[ -n ${SECRET_VALUE[api-database-url]:-} ]]; then
            SECRET_VALUE[analytics-database-url]=${SECRET_VALUE[api-database-url]}
        fi
    fi
    if selected fireworks-api-key; then
        need FIREWORKS_API_KEY "the Fireworks API key"
        mask "${FIREWORKS_API_KEY:-}"
        SECRET_VALUE[fireworks-api-key]=${FIREWORKS_API_KEY:-}
    fi
    if selected tick-secret; then
        need SFTQ_TICK_SECRET "the bearer secret of scheduler-tick (e.g. openssl rand -hex 32)"
        check_tick_secret
        SECRET_VALUE[tick-secret]=${SFTQ_TICK_SECRET:-}
    fi
}

check_tick_secret() {  # cron/_tick_secrets.sql refuses shorter ones: fail before anything runs
    [[ -n ${SFTQ_TICK_SECRET:-} ]] || return 0
    [[ ${#SFTQ_TICK_SECRET} -ge 16 ]] ||
        die "SFTQ_TICK_SECRET is shorter than 16 characters; generate one, e.g. openssl rand -hex 32"
    mask "$SFTQ_TICK_SECRET"
}

REQUIREMENTS=''
check_functions() {
    need GCP_PROJECT "the Google Cloud project id"
    need GCP_REGION "the Cloud Run functions region, e.g. europe-west1"
    if selected jobs-api || selected scheduler-tick; then
        need FIREWORKS_ACCOUNT_ID "the Fireworks account id"
    fi
    need_tool "$GCLOUD" "the Google Cloud CLI"
    local name file
    for name in "${ALL_FUNCTIONS[@]}"; do
        selected "$name" || continue
        file=$FUNCTIONS_DIR/$(entry_file "$name")
        [[ -f $file ]] || MISSING+=("  $file (the $name function) does not exist")
    done
    [[ -d $FUNCTIONS_DIR/sftq_server ]] || MISSING+=("  $FUNCTIONS_DIR/sftq_server does not exist")
    command -v "$PYTHON" >/dev/null 2>&1 ||
        die "$PYTHON not found: set SFTQ_PYTHON to the Python that has finetune-queue[server] installed"
    REQUIREMENTS=$(pin_requirements) || die "cannot pin the functions' requirements with $PYTHON: $REQUIREMENTS"
}

check_cron() {
    check_db_url
    need SFTQ_TICK_SECRET "the bearer secret of scheduler-tick, the same value as in Secret Manager"
    check_tick_secret
    if [[ -z ${SFTQ_TICK_URL:-} ]]; then
        need GCP_PROJECT "the Google Cloud project id (or set SFTQ_TICK_URL)"
        need GCP_REGION "the functions' region (or set SFTQ_TICK_URL)"
    fi
    need_tool "$PSQL" "the PostgreSQL client"
    need_file cron/schedule_tick.sql
}

check_unschedule() {
    check_db_url
    need_tool "$PSQL" "the PostgreSQL client"
    need_file cron/unschedule_tick.sql
}

# ---- steps ------------------------------------------------------------------------------

do_db() {
    # SFTQ_SQL_DIR: apply this checkout's sql/, the one that matches the code being deployed.
    run env SFTQ_SQL_DIR=sql "$SFTQ_BIN" db migrate --database-url "$SUPABASE_DB_URL"
    if [[ -n ${SFTQ_API_DB_PASSWORD:-} ]]; then
        run "$PSQL" "$SUPABASE_DB_URL" -X -q -v ON_ERROR_STOP=1 -v "login=$API_LOGIN" -v member_of=sftq_api \
            -v "password=$SFTQ_API_DB_PASSWORD" -v statement_timeout=30s -f infra/sql/login_role.sql
    fi
    if [[ -n ${SFTQ_ANALYST_DB_PASSWORD:-} ]]; then
        run "$PSQL" "$SUPABASE_DB_URL" -X -q -v ON_ERROR_STOP=1 -v "login=$ANALYST_LOGIN" -v member_of=sftq_analyst \
            -v "password=$SFTQ_ANALYST_DB_PASSWORD" -v statement_timeout=5min -f infra/sql/login_role.sql
    fi
}

do_secrets() {
    local short name
    for short in "${ALL_SECRETS[@]}"; do
        selected "$short" || continue
        name=$SQFX$short
        run_unless "$GCLOUD" secrets describe "$name" --project="$GCP_PROJECT" --quiet -- \
            "$GCLOUD" secrets create "$name" --project="$GCP_PROJECT" --replication-policy=automatic --quiet
        run_with_input "${SECRET_VALUE[$short]}" \
            "$GCLOUD" secrets versions add "$name" --project="$GCP_PROJECT" --data-file=- --quiet
        if [[ -n ${GCP_SERVICE_ACCOUNT:-} ]]; then
            run "$GCLOUD" secrets add-iam-policy-binding "$name" --project="$GCP_PROJECT" \
                --member="serviceAccount:$GCP_SERVICE_ACCOUNT" --role=roles/secretmanager.secretAccessor --quiet
        fi
    done
}

entry_file() {
    case $1 in
        jobs-api) echo jobs_api.py ;;
        analytics) echo analytics_api.py ;;
        scheduler-tick) echo scheduler_tick.py ;;
    esac
}
entry_point() {
    case $1 in
        jobs-api) echo jobs_api ;;
        analytics) echo analytics ;;
        scheduler-tick) echo scheduler_tick ;;
    esac
}
# Only what each function reads: the API functions never see the tick secret, analytics
# never sees the Fireworks key, and only scheduler-tick connects as the database owner.
function_env() {
    case $1 in
        jobs-api) echo FIREWORKS_ACCOUNT_ID FIREWORKS_BASE_URL FIREWORKS_TIMEOUT \
            SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS SFTQ_MAX_BODY_BYTES \
            SFTQ_QUEUE_TIMEOUT_SECONDS ;;
        analytics) echo SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS ;;
        scheduler-tick) echo FIREWORKS_ACCOUNT_ID FIREWORKS_BASE_URL FIREWORKS_QUOTA_ID FIREWORKS_TIMEOUT \
            SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_LEASE_SECONDS SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS \
            SFTQ_SUBMIT_MAX_ATTEMPTS SFTQ_SUBMIT_MAX_SECONDS SFTQ_SUBMIT_BACKOFF_SECONDS \
            SFTQ_RECONCILE_GET_LIMIT ;;
    esac
}
function_secrets() {
    case $1 in
        jobs-api) echo DATABASE_URL=api-database-url FIREWORKS_API_KEY=fireworks-api-key ;;
        analytics) echo DATABASE_URL=analytics-database-url ;;
        scheduler-tick) echo DATABASE_URL=database-url FIREWORKS_API_KEY=fireworks-api-key \
            SFTQ_TICK_SECRET=tick-secret ;;
    esac
}
# A tick outliving its lease is harmless (the next one takes over), but a kill before the
# lease ends keeps two ticks from overlapping in the common case.
function_timeout() {
    case $1 in
        scheduler-tick) echo 110s ;;
        *) echo 60s ;;
    esac
}

FUNCTION_PACKAGES=(functions-framework 'psycopg[binary]' psycopg-pool pydantic httpx werkzeug)
pin_requirements() {  # name==version as installed beside the code that was tested
    "$PYTHON" - "${FUNCTION_PACKAGES[@]}" 2>&1 <<'PY'
import re
import sys
from importlib import metadata

missing = []
lines = []
for req in sys.argv[1:]:
    name = re.sub(r"\[.*\]", "", req)  # the extra does not change the version
    try:
        lines.append(f"{req}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        missing.append(req)
if missing:
    sys.exit("not installed: " + ", ".join(missing) + " (pip install -e '.[server]')")
print("\n".join(lines))
PY
}

BUILD_DIR=''
# stage_function NAME: a folder with exactly what the function runs. It keeps the checkout's
# layout (functions/..., docs/openapi.json) so that paths the code finds relative to its
# package resolve as they do in the checkout; sql/ stays behind (migrations run from here).
stage_function() {
    local name=$1 dir entry
    dir=$BUILD_DIR/$name
    entry=$(entry_file "$name")
    rm -rf "$dir"
    mkdir -p "$dir/functions"
    cp "$FUNCTIONS_DIR/$entry" "$dir/functions/"
    cp -R "$FUNCTIONS_DIR/sftq_server" "$dir/functions/sftq_server"
    find "$dir/functions/sftq_server" \( -name __pycache__ -o -name '*.pyc' -o -name .mypy_cache \) -prune \
        -exec rm -rf {} +
    if [[ $name == jobs-api ]]; then
        if [[ -f docs/openapi.json ]]; then
            mkdir -p "$dir/docs"
            cp docs/openapi.json "$dir/docs/"
        else
            note "warning: docs/openapi.json is missing: the deployed jobs-api will answer 404 on /openapi.json"
        fi
    fi
    # The Python buildpack loads main.py from the folder's root.
    cat >"$dir/main.py" <<PY
# Generated by $PROG. The Python buildpack loads main.py; the function itself lives in
# functions/$entry, staged with the checkout's layout.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "functions"))

from ${entry%.py} import $(entry_point "$name")  # noqa: E402,F401
PY
    {
        printf '# Generated by %s: the versions installed where it ran.\n' "$PROG"
        printf '%s\n' "$REQUIREMENTS"
    } >"$dir/requirements.txt"
    note "staged $name in $dir"
}

do_functions() {
    if [[ -n ${SFTQ_BUILD_DIR:-} ]]; then
        BUILD_DIR=$(from_caller "$SFTQ_BUILD_DIR")
        mkdir -p "$BUILD_DIR"
    else
        BUILD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sftq-functions.XXXXXX")
        if ((!DRY_RUN)); then trap 'rm -rf "$BUILD_DIR"' EXIT; fi
    fi
    local name pairs var short args
    for name in "${ALL_FUNCTIONS[@]}"; do
        selected "$name" || continue
        stage_function "$name"
        args=("$GCLOUD" functions deploy "$name" --project="$GCP_PROJECT" --region="$GCP_REGION"
            --gen2 --runtime=python311 --source="$BUILD_DIR/$name" --entry-point="$(entry_point "$name")"
            --trigger-http --allow-unauthenticated --timeout="$(function_timeout "$name")")
        if [[ -n ${GCP_SERVICE_ACCOUNT:-} ]]; then args+=(--service-account="$GCP_SERVICE_ACCOUNT"); fi
        pairs=()
        for var in $(function_env "$name"); do
            [[ -n ${!var:-} ]] || continue
            [[ ${!var} != *,* ]] || die "$var contains a comma, which --set-env-vars cannot carry"
            pairs+=("$var=${!var}")
        done
        # --set-env-vars and --set-secrets replace what a previous deploy set: nothing stale stays.
        if ((${#pairs[@]})); then args+=("--set-env-vars=$(IFS=,; echo "${pairs[*]}")"); else args+=(--clear-env-vars); fi
        pairs=()
        for var in $(function_secrets "$name"); do pairs+=("${var%%=*}=$SQFX${var#*=}:latest"); done
        args+=("--set-secrets=$(IFS=,; echo "${pairs[*]}")" --quiet)
        run "${args[@]}"
    done
}

tick_url() {
    if [[ -n ${SFTQ_TICK_URL:-} ]]; then
        printf '%s' "$SFTQ_TICK_URL"
    else
        printf 'https://%s-%s.cloudfunctions.net/scheduler-tick' "$GCP_REGION" "$GCP_PROJECT"
    fi
}

do_cron() {
    run "$PSQL" "$SUPABASE_DB_URL" -X -q -v ON_ERROR_STOP=1 -v "tick_url=$(tick_url)" \
        -v "tick_secret=$SFTQ_TICK_SECRET" -f cron/schedule_tick.sql
}

do_unschedule() {
    run "$PSQL" "$SUPABASE_DB_URL" -X -q -v ON_ERROR_STOP=1 -f cron/unschedule_tick.sql
}

# ---- main -------------------------------------------------------------------------------

ONLY=''
STEPS=()
while (($#)); do
    case $1 in
        -n | --dry-run) DRY_RUN=1 ;;
        --only) (($# > 1)) || { usage >&2; exit 2; }; ONLY=$2; shift ;;
        --only=*) ONLY=${1#--only=} ;;
        -h | --help) usage; exit 0 ;;
        all) STEPS+=(db secrets functions cron) ;;
        db | secrets | functions | cron | unschedule) STEPS+=("$1") ;;
        *) printf '%s: unknown argument: %s\n\n' "$PROG" "$1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if ((${#STEPS[@]} == 0)); then
    usage >&2
    exit 2
fi
if [[ -n $ONLY ]]; then
    [[ ${#STEPS[@]} == 1 && ${STEPS[0]} =~ ^(secrets|functions)$ ]] ||
        die "--only goes with a single secrets or functions step"
    if [[ ${STEPS[0]} == secrets ]]; then known=" ${ALL_SECRETS[*]} "; else known=" ${ALL_FUNCTIONS[*]} "; fi
    IFS=, read -ra wanted <<<"$ONLY"
    for w in "${wanted[@]}"; do
        [[ $known == *" $w "* ]] || die "--only: unknown ${STEPS[0]} name '$w' (one of:$known)"
    done
fi

# Check every step's settings before running any, so that a missing one never leaves a
# half-done deployment behind.
for step in "${STEPS[@]}"; do "check_$step"; done
if ((${#MISSING[@]})); then
    printf '%s: error: missing settings for %s:\n' "$PROG" "${STEPS[*]}" >&2
    printf '%s\n' "${MISSING[@]}" >&2
    exit 1
fi
((DRY_RUN)) && note "dry run: these are the commands, run from the repository root; nothing runs"
for step in "${STEPS[@]}"; do "do_$step"; done
