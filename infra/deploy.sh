#!/usr/bin/env bash
# Deploys finetune-queue for real: the queue database on a Supabase project, the HTTP
# functions on Cloud Run (as services from one container image, or as Cloud Run functions)
# with their secrets in Secret Manager, and the pg_cron jobs that fire the scheduler tick and
# the webhook deliveries. docs/operations.md explains each step.
#
# Every command it runs goes through `run` (or run_cmd), which first prints it, one line,
# shell-quoted, with secrets shown as ***. With --dry-run it prints them and runs nothing (it
# still stages the source folders locally, so that what would be uploaded can be inspected).
# Commands are printed relative to the repository root, where the script runs.
#
# No secret is ever on a command line (where `ps` shows it to every local user): gcloud and
# psql get values on stdin, sftq gets DATABASE_URL in its environment, psql gets the URL
# without its password and the password as PGPASSWORD in its environment.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: infra/deploy.sh [--dry-run] [--only NAMES] STEP...

Steps (run in the order given; `all` = db secrets services cron):
  db          apply migrations to SUPABASE_DB_URL; create the login roles asked for; check
              that Supabase's Data API cannot reach schema sftq
  secrets     store the functions' secrets in Secret Manager (a new version each run; the
              webhooks key is generated once when SFTQ_WEBHOOKS_KEY is not set)
  services    build the container image (Dockerfile) with Cloud Build and deploy the
              functions as Cloud Run services from it: jobs-api, analytics and
              scheduler-tick (granian, WSGI), webhook-deliver (granian, WSGI) and jobs-stream
              (uvicorn, ASGI: the two stream routes, long-lived requests)
  functions   or: stage and deploy them as Cloud Run functions (gen2, python311; jobs-stream
              on functions-framework's ASGI stack)
  cron        schedule the 30-second tick and the webhook deliveries with pg_cron (running it
              again replaces the jobs), close pg_net to other roles, and check that it is closed
  unschedule  remove the pg_cron jobs (the tick's and the webhook deliveries')
  all         db, secrets, services, cron

Options:
  -n, --dry-run  print the exact commands, one per line, secrets masked; run nothing
  --only NAMES   with a single `secrets`, `services` or `functions` step: only these
                 (comma-separated)
                 secrets: database-url, api-database-url, analytics-database-url,
                          fireworks-api-key, tick-secret, webhooks-key
                 services, functions: jobs-api, analytics, scheduler-tick,
                          webhook-deliver, jobs-stream

Settings (environment variables):
  SUPABASE_DB_URL           direct or session connection, port 5432 (db, cron, unschedule);
                            the owner's URL is used for these only, never by a function
  SUPABASE_POOLER_URL       transaction pooler, port 6543 (secrets: its host and user suffix)
  SFTQ_API_DB_PASSWORD      db: create/update login role sftq_api_login (member of sftq_api);
                            secrets: derive the API functions' DATABASE_URL from the pooler URL
  SFTQ_API_DATABASE_URL     secrets: the API functions' DATABASE_URL, instead of deriving it
  SFTQ_SCHEDULER_DB_PASSWORD  db: create/update login role sftq_scheduler_login (member of
                            sftq_scheduler); secrets: scheduler-tick's DATABASE_URL from the pooler URL
  SFTQ_SCHEDULER_DATABASE_URL  secrets: scheduler-tick's DATABASE_URL, instead of deriving it
  SFTQ_ANALYST_DB_PASSWORD  db: create/update login role sftq_analyst_login (member of sftq_analyst)
  SFTQ_API_LOGIN_ROLE, SFTQ_SCHEDULER_LOGIN_ROLE, SFTQ_ANALYST_LOGIN_ROLE   login role names
  SUPABASE_ACCESS_TOKEN     db: a personal access token, to check through Supabase's Management
                            API that sftq is not among the Data API's exposed schemas
  SUPABASE_PROJECT_REF      the project ref (default: read from SUPABASE_DB_URL)
  ANALYTICS_DATABASE_URL    secrets: DATABASE_URL of the analytics function (default: the API's)
  FIREWORKS_API_KEY         secrets
  SFTQ_TICK_SECRET          secrets, cron: the tick secret (at least 32 characters); it also
                            guards webhook-deliver
  SFTQ_WEBHOOKS_KEY         secrets: the key(s) sealing webhook signing secrets (each at least
                            32 characters; comma-separated to rotate, the first seals). Unset:
                            one is generated (like openssl rand -base64 32) if Secret Manager
                            holds none yet, and an existing one is kept
  GCP_PROJECT, GCP_REGION   secrets (project), services, functions, cron (to derive the tick URL)
  GCP_SERVICE_ACCOUNT       optional: runtime identity of the functions, granted access to the secrets
  FIREWORKS_ACCOUNT_ID      services, functions
  SFTQ_IMAGE_TAG            services: the image tag (default: the git commit, -dirty if changed)
  SUPABASE_URL              cron: the tick goes to $SUPABASE_URL/functions/v1/scheduler-tick
                            (the Edge proxy, supabase/functions/scheduler-tick)
  SFTQ_TICK_URL             cron: the tick URL (default: from SUPABASE_URL, else
                            https://REGION-PROJECT.cloudfunctions.net/scheduler-tick)
  SFTQ_WEBHOOKS_DELIVER_URL cron: webhook-deliver's URL (default: SUPABASE_URL's
                            /functions/v1/webhook-deliver, else
                            https://REGION-PROJECT.cloudfunctions.net/webhook-deliver)
  Passed to the functions when set: FIREWORKS_BASE_URL FIREWORKS_QUOTA_ID FIREWORKS_TIMEOUT
    FIREWORKS_RPM (the account's requests a minute, shared by every process)
    SFTQ_PROVIDER_TICK_RESERVE SFTQ_PROVIDER_USER_SHARE SFTQ_PROVIDER_LOOKUP_TTL_SECONDS
      (the provider budget's shares; docs/operations.md, Provider budget)
    SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_LEASE_SECONDS SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS
    SFTQ_MAX_BODY_BYTES SFTQ_QUEUE_TIMEOUT_SECONDS SFTQ_SUBMIT_MAX_ATTEMPTS SFTQ_SUBMIT_MAX_SECONDS
    SFTQ_SUBMIT_BACKOFF_SECONDS SFTQ_RECONCILE_GET_LIMIT SFTQ_TICK_INTERVAL_SECONDS
    SFTQ_JOB_FAULT_LIMIT (ticks in a row a job's handling may fail before it ends FAIL)
    SFTQ_MAX_RUN_SECONDS SFTQ_STALL_SECONDS (run-time bound and stall check; docs/scheduling.md)
    SFTQ_CAPACITY_SHOW_USERS SFTQ_WEBHOOKS_ALLOW_PRIVATE SFTQ_GROUP_COMMIT_MAX
    SFTQ_GROUP_COMMIT_LINGER_MS SFTQ_GATEWAY_THREADS SFTQ_PREFLIGHT (on|off: the pre-flight check)
    SFTQ_PREFLIGHT_BUDGET_MS SFTQ_PREFLIGHT_TICK_LIMIT (its provider checks; docs/api.md)
    SFTQ_EVENT_ADMISSION (on|off: woken admission) SFTQ_WAKE_MIN_GAP_SECONDS
    SFTQ_RECONCILE_FRESHNESS_SECONDS (docs/scheduling.md, How admission is woken)
    SFTQ_METRICS_TOKEN (jobs-api's GET /metrics bearer; docs/operations.md, Metrics)
    SFTQ_STREAM_HEARTBEAT_SECONDS
    SFTQ_STREAM_MAX_SECONDS (below jobs-stream's 3600 s request timeout) SFTQ_STREAM_POLL_MS
    SFTQ_MCP_ALLOWED_HOSTS (the Host values the MCP endpoint answers; docs/agents.md)
  SFTQ_SECRET_PREFIX        Secret Manager names are PREFIX + short name (default sftq-)
  SFTQ_BUILD_DIR            where functions are staged (default: a new temporary folder)
  SFTQ_FUNCTIONS_DIR        the functions' source (default functions)
  SFTQ_PYTHON               the Python whose installed versions pin requirements.txt (default python3)
  SFTQ_BIN, PSQL, GCLOUD, CURL   the commands to use (default sftq, psql, gcloud, curl)
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

# run_cmd [--stdin VALUE] NAME=VALUE... -- CMD...: each NAME=VALUE goes to CMD's environment
# and VALUE to its stdin; neither ever reaches a command line. Printed as a shell would run it:
#   printf %s '***' | NAME='***' CMD ...
run_cmd() {
    local input='' has_input=0 envs=() e line=''
    if [[ $1 == --stdin ]]; then input=$2; has_input=1; shift 2; fi
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    if ((has_input)); then line="$(render printf %s "$input") | "; fi
    for e in "${envs[@]}"; do line+="${e%%=*}=$(render "${e#*=}") "; done
    printf '%s%s\n' "$line" "$(render "$@")"
    ((DRY_RUN)) && return 0
    if ((has_input)); then
        printf %s "$input" | (for e in "${envs[@]}"; do export "${e?}"; done; exec "$@")
    else
        (for e in "${envs[@]}"; do export "${e?}"; done; exec "$@")
    fi
}

# run_unless CHECK... -- CMD...: CMD only when CHECK fails.
run_unless() {
    local check=()
    while [[ $1 != -- ]]; do check+=("$1"); shift; done
    shift
    printf '%s >/dev/null 2>&1 || %s\n' "$(render "${check[@]}")" "$(render "$@")"
    if ((!DRY_RUN)); then "${check[@]}" >/dev/null 2>&1 || "$@"; fi
}

# run_unless_with_input VALUE CHECK... -- CMD...: CMD, with VALUE on its stdin, only when
# CHECK fails.
run_unless_with_input() {
    local input=$1 check=()
    shift
    while [[ $1 != -- ]]; do check+=("$1"); shift; done
    shift
    printf '%s >/dev/null 2>&1 || %s | %s\n' "$(render "${check[@]}")" \
        "$(render printf %s "$input")" "$(render "$@")"
    if ((!DRY_RUN)); then "${check[@]}" >/dev/null 2>&1 || printf %s "$input" | "$@"; fi
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

urldecode() {  # %XX escapes back to bytes; nothing else is touched (a backslash stays one)
    local LC_ALL=C s=$1 decoded='' i
    for ((i = 0; i < ${#s}; i++)); do
        if [[ ${s:i:1} == % && ${s:i+1:2} =~ ^[0-9A-Fa-f]{2}$ ]]; then
            printf -v decoded '%s'"\\x${s:i+1:2}" "$decoded"
            i=$((i + 2))
        else
            decoded+=${s:i:1}
        fi
    done
    printf '%s' "$decoded"
}

# psql_for VAR: sets PSQL_URL (VAR's URL without its password: safe on a command line) and
# PSQL_ENV (PGPASSWORD=..., for the environment, or nothing when there is no password).
PSQL_URL='' PSQL_ENV=()
psql_for() {
    parse_url "$1"
    PSQL_URL=$U_SCHEME$U_USER@$U_HOSTPART
    PSQL_ENV=()
    if [[ -n $U_PASS ]]; then
        local pw
        pw=$(urldecode "$U_PASS")
        mask "$pw"
        PSQL_ENV=("PGPASSWORD=$pw")
    fi
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
CURL=${CURL:-curl}
PYTHON=${SFTQ_PYTHON:-python3}
FUNCTIONS_DIR=functions
if [[ -n ${SFTQ_FUNCTIONS_DIR:-} ]]; then FUNCTIONS_DIR=$(from_caller "$SFTQ_FUNCTIONS_DIR"); fi
API_LOGIN=${SFTQ_API_LOGIN_ROLE:-sftq_api_login}
SCHEDULER_LOGIN=${SFTQ_SCHEDULER_LOGIN_ROLE:-sftq_scheduler_login}
ANALYST_LOGIN=${SFTQ_ANALYST_LOGIN_ROLE:-sftq_analyst_login}
ALL_SECRETS=(database-url api-database-url analytics-database-url fireworks-api-key tick-secret
    webhooks-key)
ALL_FUNCTIONS=(jobs-api analytics scheduler-tick webhook-deliver jobs-stream)

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

project_ref() {  # SUPABASE_PROJECT_REF, else from db.<ref>.supabase.co or user postgres.<ref>
    if [[ -n ${SUPABASE_PROJECT_REF:-} ]]; then printf '%s' "$SUPABASE_PROJECT_REF"; return; fi
    parse_url SUPABASE_DB_URL
    if [[ $U_HOSTPART =~ ^db\.([a-z0-9]+)\.supabase\.(co|com)([:/?]|$) ]]; then
        printf '%s' "${BASH_REMATCH[1]}"
    elif [[ $U_USER == *.* ]]; then
        printf '%s' "${U_USER#*.}"
    fi
}

check_db() {
    check_db_url
    check_login_password SFTQ_API_DB_PASSWORD "$API_LOGIN"
    check_login_password SFTQ_SCHEDULER_DB_PASSWORD "$SCHEDULER_LOGIN"
    check_login_password SFTQ_ANALYST_DB_PASSWORD "$ANALYST_LOGIN"
    need_tool "$SFTQ_BIN" "the sftq CLI: pip install -e '.[server]'"
    need_tool "$PSQL" "the PostgreSQL client"
    need_file infra/sql/check_data_api.sql
    if [[ -n ${SUPABASE_ACCESS_TOKEN:-} ]]; then
        mask "$SUPABASE_ACCESS_TOKEN"
        need_tool "$CURL" "curl, to ask Supabase's Management API"
        need_tool "$PYTHON" "Python, to read the Management API's answer"
        if [[ -n ${SUPABASE_DB_URL:-} && -z $(project_ref) ]]; then
            need SUPABASE_PROJECT_REF "the project ref (not found in SUPABASE_DB_URL)"
        fi
    fi
}

selected() {  # selected NAME: is NAME in --only (or is there no --only)?
    [[ -z $ONLY ]] || [[ ",$ONLY," == *",$1,"* ]]
}

# Each secret's value, filled by check_secrets.
declare -A SECRET_VALUE=()

# login_database_url SECRET EXPLICIT_VAR PASSWORD_VAR LOGIN WHO: a function's DATABASE_URL,
# given outright or derived from the pooler URL with a login role's name and password.
login_database_url() {
    local short=$1 explicit=$2 password=$3 login=$4 who=$5
    if [[ -n ${!explicit:-} ]]; then
        parse_url "$explicit"
        SECRET_VALUE[$short]=${!explicit}
        return
    fi
    need "$password" "the password of login role $login (or set $explicit): functions never connect as the owner ($who)"
    need SUPABASE_POOLER_URL "the project's transaction pooler URL (port 6543)"
    [[ -n ${!password:-} && -n ${SUPABASE_POOLER_URL:-} ]] || return 0
    check_login_password "$password" "$login"
    parse_url SUPABASE_POOLER_URL
    if [[ $U_PORT != 6543 ]]; then
        note "warning: SUPABASE_POOLER_URL uses port $U_PORT; Supabase's transaction pooler is 6543"
    fi
    # Supavisor names users ROLE.PROJECT_REF: keep the pooler user's suffix.
    local suffix='' encoded
    [[ $U_USER == *.* ]] && suffix=.${U_USER#*.}
    encoded=$(urlencode "${!password}")
    mask "$encoded"
    SECRET_VALUE[$short]=$U_SCHEME$login$suffix:$encoded@$U_HOSTPART
}

api_database_url() {
    login_database_url api-database-url SFTQ_API_DATABASE_URL SFTQ_API_DB_PASSWORD "$API_LOGIN" \
        "jobs-api and analytics"
}

check_secrets() {
    need GCP_PROJECT "the Google Cloud project id"
    need_tool "$GCLOUD" "the Google Cloud CLI"
    if selected database-url; then
        login_database_url database-url SFTQ_SCHEDULER_DATABASE_URL SFTQ_SCHEDULER_DB_PASSWORD \
            "$SCHEDULER_LOGIN" "scheduler-tick"
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
    if selected webhooks-key; then
        webhooks_key
    fi
}

# The webhooks key seals endpoints' signing secrets in the database: a new key makes every
# endpoint sealed under the old one unusable, so it is never replaced behind the operator's
# back. Given (SFTQ_WEBHOOKS_KEY), it becomes the new version, like the other secrets; not
# given, one is generated and stored only while Secret Manager holds no version yet.
WEBHOOKS_KEY_GENERATED=0
webhooks_key() {
    local key
    if [[ -n ${SFTQ_WEBHOOKS_KEY:-} ]]; then
        local keys=()
        IFS=$', \t\n' read -ra keys <<<"$SFTQ_WEBHOOKS_KEY"
        for key in "${keys[@]}"; do
            [[ -n $key ]] || continue
            [[ ${#key} -ge 32 ]] ||
                die "SFTQ_WEBHOOKS_KEY: each key must be at least 32 characters; generate one, e.g. openssl rand -base64 32"
        done
        mask "$SFTQ_WEBHOOKS_KEY" "${keys[@]}"
        SECRET_VALUE[webhooks-key]=$SFTQ_WEBHOOKS_KEY
        return
    fi
    # 32 random bytes, base64: what `openssl rand -base64 32` prints (44 characters).
    key=$(head -c 32 /dev/urandom | base64 | tr -d '\n') || die "cannot generate the webhooks key"
    mask "$key"
    SECRET_VALUE[webhooks-key]=$key
    WEBHOOKS_KEY_GENERATED=1
}

check_tick_secret() {  # scheduler-tick and cron/_tick_secrets.sql refuse shorter ones: fail first
    [[ -n ${SFTQ_TICK_SECRET:-} ]] || return 0
    [[ ${#SFTQ_TICK_SECRET} -ge 32 ]] ||
        die "SFTQ_TICK_SECRET is shorter than 32 characters; generate one, e.g. openssl rand -hex 32"
    mask "$SFTQ_TICK_SECRET"
}

# A stream must end itself (`reconnect`) before the platform cuts its request.
check_stream_settings() {
    selected jobs-stream || return 0
    local max=${SFTQ_STREAM_MAX_SECONDS:-}
    [[ -n $max ]] || return 0
    [[ $max =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "SFTQ_STREAM_MAX_SECONDS must be a number of seconds"
    ((${max%%.*} < STREAM_TIMEOUT_SECONDS - 60)) ||
        die "SFTQ_STREAM_MAX_SECONDS ($max) must stay a minute under jobs-stream's request timeout (${STREAM_TIMEOUT_SECONDS} s, Cloud Run's most), so that streams end with \`reconnect\` instead of being cut"
}

allow_private_warning() {
    if [[ -n ${SFTQ_WEBHOOKS_ALLOW_PRIVATE:-} ]] && (selected jobs-api || selected webhook-deliver); then
        note "warning: SFTQ_WEBHOOKS_ALLOW_PRIVATE is set: webhooks may be sent over http:// and to private, loopback and metadata addresses (meant for sftq dev and tests)"
    fi
}

REQUIREMENTS=''
check_services() {
    need GCP_PROJECT "the Google Cloud project id"
    need GCP_REGION "the Cloud Run region, e.g. europe-west1"
    if selected jobs-api || selected scheduler-tick; then
        need FIREWORKS_ACCOUNT_ID "the Fireworks account id"
    fi
    need_tool "$GCLOUD" "the Google Cloud CLI"
    [[ -f Dockerfile ]] || MISSING+=("  Dockerfile does not exist")
    [[ -f docs/openapi.json ]] || MISSING+=("  docs/openapi.json does not exist (the image serves it)")
    [[ -d $FUNCTIONS_DIR/sftq_server ]] || MISSING+=("  $FUNCTIONS_DIR/sftq_server does not exist")
    check_stream_settings
    allow_private_warning
    command -v "$PYTHON" >/dev/null 2>&1 ||
        die "$PYTHON not found: set SFTQ_PYTHON to the Python that has finetune-queue[server] and granian installed"
    CONSTRAINTS=$(pin_requirements "${IMAGE_PACKAGES[@]}") ||
        die "cannot pin the image's packages with $PYTHON: $CONSTRAINTS"
}

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
    check_stream_settings
    allow_private_warning
    command -v "$PYTHON" >/dev/null 2>&1 ||
        die "$PYTHON not found: set SFTQ_PYTHON to the Python that has finetune-queue[server] installed"
    REQUIREMENTS=$(pin_requirements "${FUNCTION_PACKAGES[@]}") ||
        die "cannot pin the functions' requirements with $PYTHON: $REQUIREMENTS"
}

check_cron() {
    check_db_url
    need SFTQ_TICK_SECRET "the bearer secret of scheduler-tick, the same value as in Secret Manager"
    check_tick_secret
    if [[ -z ${SFTQ_TICK_URL:-}${SUPABASE_URL:-} || -z ${SFTQ_WEBHOOKS_DELIVER_URL:-}${SUPABASE_URL:-} ]]
    then
        need GCP_PROJECT "the Google Cloud project id (or set SUPABASE_URL, or SFTQ_TICK_URL and SFTQ_WEBHOOKS_DELIVER_URL)"
        need GCP_REGION "the functions' region (or set SUPABASE_URL, or SFTQ_TICK_URL and SFTQ_WEBHOOKS_DELIVER_URL)"
    fi
    need_tool "$PSQL" "the PostgreSQL client"
    need_file cron/schedule_tick.sql
    need_file cron/schedule_webhooks.sql
    need_file cron/check_net_private.sql
}

check_unschedule() {
    check_db_url
    need_tool "$PSQL" "the PostgreSQL client"
    need_file cron/unschedule_tick.sql
    need_file cron/unschedule_webhooks.sql
}

# ---- steps ------------------------------------------------------------------------------

do_db() {
    # SFTQ_SQL_DIR: apply this checkout's sql/, the one that matches the code being deployed.
    run_cmd SFTQ_SQL_DIR=sql "DATABASE_URL=$SUPABASE_DB_URL" -- "$SFTQ_BIN" db migrate
    # Passwords go on stdin; sftq sends the server only a SCRAM verifier computed here.
    local spec login group timeout password
    for spec in "SFTQ_API_DB_PASSWORD $API_LOGIN sftq_api 30s" \
                "SFTQ_SCHEDULER_DB_PASSWORD $SCHEDULER_LOGIN sftq_scheduler 60s" \
                "SFTQ_ANALYST_DB_PASSWORD $ANALYST_LOGIN sftq_analyst 5min"; do
        read -r password login group timeout <<<"$spec"
        [[ -n ${!password:-} ]] || continue
        run_cmd --stdin "${!password}" "DATABASE_URL=$SUPABASE_DB_URL" -- \
            "$SFTQ_BIN" db login-role "$login" --member-of "$group" --statement-timeout "$timeout"
    done
    # Fail loudly if Supabase's Data API (anon, authenticated) could reach the queue.
    psql_for SUPABASE_DB_URL
    run_cmd "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 -f infra/sql/check_data_api.sql ||
        die "the migrations are applied, but Supabase's Data API could reach schema sftq: run each \`fix:\` statement that infra/sql/check_data_api.sql listed above (as the owner, on SUPABASE_DB_URL), then run infra/deploy.sh db again; do not deploy the functions until it passes"
    check_exposed_schemas
}

# The Data API's exposed schemas live in the project's settings, not in the database: ask the
# Management API (the token goes on curl's stdin, as a config line).
check_exposed_schemas() {
    local url answer schemas
    if [[ -z ${SUPABASE_ACCESS_TOKEN:-} ]]; then
        local ref
        ref=$(project_ref)
        note "warning: SUPABASE_ACCESS_TOKEN is not set, so the project's list of the Data API's exposed schemas was NOT checked (it is kept outside the database; only the in-database pgrst.db_schemas settings were). Check that sftq is not in it: in the dashboard, Settings > API > Exposed schemas; or set SUPABASE_ACCESS_TOKEN (a personal access token) and run infra/deploy.sh db again, which reads db_schema from https://api.supabase.com/v1/projects/${ref:-<project-ref>}/postgrest"
        return 0
    fi
    url="https://api.supabase.com/v1/projects/$(project_ref)/postgrest"
    local config="header = \"Authorization: Bearer $SUPABASE_ACCESS_TOKEN\""
    printf '%s | %s\n' "$(render printf %s "$config")" "$(render "$CURL" -fsS --config - "$url")"
    ((DRY_RUN)) && return 0
    answer=$(printf %s "$config" | "$CURL" -fsS --config - "$url") ||
        die "could not read the Data API's settings from $url"
    schemas=$(printf %s "$answer" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin).get("db_schema", ""))') ||
        die "unexpected answer from $url"
    if [[ ",${schemas// /}," == *,sftq,* ]]; then
        die "schema sftq is among the Data API's exposed schemas ($schemas): remove it in Settings > API > Exposed schemas; the queue is reached only through its functions"
    fi
    note "the Data API exposes: $schemas (not sftq)"
}

do_secrets() {
    local short name
    for short in "${ALL_SECRETS[@]}"; do
        selected "$short" || continue
        name=$SQFX$short
        run_unless "$GCLOUD" secrets describe "$name" --project="$GCP_PROJECT" --quiet -- \
            "$GCLOUD" secrets create "$name" --project="$GCP_PROJECT" --replication-policy=automatic --quiet
        if [[ $short == webhooks-key ]] && ((WEBHOOKS_KEY_GENERATED)); then
            # Generated: stored only when there is no version yet (see webhooks_key).
            run_unless_with_input "${SECRET_VALUE[$short]}" \
                "$GCLOUD" secrets versions describe latest --secret="$name" --project="$GCP_PROJECT" --quiet -- \
                "$GCLOUD" secrets versions add "$name" --project="$GCP_PROJECT" --data-file=- --quiet
        else
            run_with_input "${SECRET_VALUE[$short]}" \
                "$GCLOUD" secrets versions add "$name" --project="$GCP_PROJECT" --data-file=- --quiet
        fi
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
        webhook-deliver) echo webhook_deliver.py ;;
        jobs-stream) echo jobs_stream.py ;;
    esac
}
entry_point() {
    case $1 in
        jobs-api) echo jobs_api ;;
        analytics) echo analytics ;;
        scheduler-tick) echo scheduler_tick ;;
        webhook-deliver) echo webhook_deliver ;;
        jobs-stream) echo jobs_stream ;;
    esac
}
# Only what each function reads: the API functions never see the tick secret, analytics
# never sees the Fireworks key, the webhooks key reaches only the two functions that seal or
# open signing secrets, and no function connects as the database owner. webhook-deliver
# claims deliveries with the scheduler's procedures (its login); jobs-stream authenticates
# callers' keys with the API's.
function_env() {
    case $1 in
        jobs-api) echo FIREWORKS_ACCOUNT_ID FIREWORKS_BASE_URL FIREWORKS_QUOTA_ID FIREWORKS_TIMEOUT \
            SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS SFTQ_MAX_BODY_BYTES \
            SFTQ_QUEUE_TIMEOUT_SECONDS SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_INTERVAL_SECONDS \
            SFTQ_CAPACITY_SHOW_USERS SFTQ_WEBHOOKS_ALLOW_PRIVATE SFTQ_GROUP_COMMIT_MAX \
            SFTQ_GROUP_COMMIT_LINGER_MS SFTQ_GATEWAY_THREADS SFTQ_METRICS_TOKEN SFTQ_PREFLIGHT \
            SFTQ_PREFLIGHT_BUDGET_MS FIREWORKS_RPM SFTQ_MCP_ALLOWED_HOSTS SFTQ_PROVIDER_TICK_RESERVE \
            SFTQ_PROVIDER_USER_SHARE SFTQ_PROVIDER_LOOKUP_TTL_SECONDS ;;
        analytics) echo SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS \
            SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_INTERVAL_SECONDS ;;
        scheduler-tick) echo FIREWORKS_ACCOUNT_ID FIREWORKS_BASE_URL FIREWORKS_QUOTA_ID FIREWORKS_TIMEOUT \
            SFTQ_USAGE_GRACE_SECONDS SFTQ_TICK_LEASE_SECONDS SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS \
            SFTQ_SUBMIT_MAX_ATTEMPTS SFTQ_SUBMIT_MAX_SECONDS SFTQ_SUBMIT_BACKOFF_SECONDS \
            SFTQ_RECONCILE_GET_LIMIT SFTQ_TICK_INTERVAL_SECONDS SFTQ_PREFLIGHT \
            SFTQ_PREFLIGHT_TICK_LIMIT FIREWORKS_RPM SFTQ_JOB_FAULT_LIMIT \
            SFTQ_MAX_RUN_SECONDS SFTQ_STALL_SECONDS SFTQ_EVENT_ADMISSION SFTQ_WAKE_MIN_GAP_SECONDS \
            SFTQ_RECONCILE_FRESHNESS_SECONDS SFTQ_PROVIDER_TICK_RESERVE \
            SFTQ_PROVIDER_LOOKUP_TTL_SECONDS ;;
        webhook-deliver) echo SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS SFTQ_WEBHOOKS_ALLOW_PRIVATE ;;
        jobs-stream) echo SFTQ_DB_POOL_MAX SFTQ_DB_TIMEOUT_SECONDS SFTQ_STREAM_HEARTBEAT_SECONDS \
            SFTQ_STREAM_MAX_SECONDS SFTQ_STREAM_POLL_MS ;;
    esac
}
function_secrets() {
    case $1 in
        jobs-api) echo DATABASE_URL=api-database-url FIREWORKS_API_KEY=fireworks-api-key \
            SFTQ_WEBHOOKS_KEY=webhooks-key ;;
        analytics) echo DATABASE_URL=analytics-database-url ;;
        scheduler-tick) echo DATABASE_URL=database-url FIREWORKS_API_KEY=fireworks-api-key \
            SFTQ_TICK_SECRET=tick-secret ;;
        webhook-deliver) echo DATABASE_URL=database-url SFTQ_TICK_SECRET=tick-secret \
            SFTQ_WEBHOOKS_KEY=webhooks-key ;;
        jobs-stream) echo DATABASE_URL=api-database-url ;;
    esac
}
# A tick outliving its lease is harmless (the next one takes over), but a kill before the
# lease ends keeps two ticks from overlapping in the common case. A delivery pass stops
# starting attempts after 20 s, and an attempt takes at most 10 s. A stream ends itself after
# SFTQ_STREAM_MAX_SECONDS (3300 by default) with `reconnect`: the request timeout must be
# longer, and 3600 s is the most Cloud Run allows.
STREAM_TIMEOUT_SECONDS=3600
function_timeout() {
    case $1 in
        scheduler-tick) echo 110s ;;
        jobs-stream) echo "${STREAM_TIMEOUT_SECONDS}s" ;;
        *) echo 60s ;;
    esac
}
# Sizing beyond the defaults, as `gcloud functions deploy` flags. A delivery pass mostly
# waits on receivers, and overlapping passes share the work (SKIP LOCKED), so a few share an
# instance. A stream is an idle connection, a timer and a share of one poll per second for
# all streams of the instance (docs/performance.md: 1,000 streams, 126 MiB, 0.7% of a core):
# one instance holds a thousand.
function_sizing() {
    case $1 in
        webhook-deliver) echo --memory=512Mi --cpu=1 --concurrency=4 ;;
        jobs-stream) echo --memory=512Mi --cpu=1 --concurrency=1000 ;;
    esac
}

FUNCTION_PACKAGES=(functions-framework 'psycopg[binary]' psycopg-pool pydantic httpx werkzeug
    cryptography prometheus_client)
# The image's pins are pip constraints, which take no extras: psycopg[binary] is two names.
IMAGE_PACKAGES=(psycopg psycopg-binary psycopg-pool pydantic httpx werkzeug granian uvicorn
    cryptography prometheus_client)
CONSTRAINTS=''
pin_requirements() {  # pin_requirements PKG...: name==version as installed beside the tested code
    "$PYTHON" - "$@" 2>&1 <<'PY'
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
    sys.exit("not installed: " + ", ".join(missing) + " (pip install -e '.[server]' granian)")
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

PY
    if [[ $name == jobs-stream ]]; then
        # functions-framework serves a target registered with functions_framework.aio.http
        # on its ASGI stack (Starlette under uvicorn workers), as `--asgi` would locally.
        cat >>"$dir/main.py" <<PY
import functions_framework.aio  # noqa: E402

from ${entry%.py} import $(entry_point "$name") as _asgi_target  # noqa: E402

$(entry_point "$name") = functions_framework.aio.http(_asgi_target)
PY
    else
        printf 'from %s import %s  # noqa: E402,F401\n' "${entry%.py}" "$(entry_point "$name")" \
            >>"$dir/main.py"
    fi
    {
        printf '# Generated by %s: the versions installed where it ran.\n' "$PROG"
        printf '%s\n' "$REQUIREMENTS"
    } >"$dir/requirements.txt"
    note "staged $name in $dir"
}

use_build_dir() {
    [[ -z $BUILD_DIR ]] || return 0
    if [[ -n ${SFTQ_BUILD_DIR:-} ]]; then
        BUILD_DIR=$(from_caller "$SFTQ_BUILD_DIR")
        mkdir -p "$BUILD_DIR"
    else
        BUILD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sftq-functions.XXXXXX")
        if ((!DRY_RUN)); then trap 'rm -rf "$BUILD_DIR"' EXIT; fi
    fi
}

# settings_args NAME: appends to ARGS the function's env vars and secrets. --set-env-vars (or
# --clear-env-vars) and --set-secrets replace what a previous deploy set: nothing stale stays.
settings_args() {
    local name=$1 pairs=() var
    for var in $(function_env "$name"); do
        [[ -n ${!var:-} ]] || continue
        [[ ${!var} != *,* ]] || die "$var contains a comma, which --set-env-vars cannot carry"
        pairs+=("$var=${!var}")
    done
    if ((${#pairs[@]})); then ARGS+=("--set-env-vars=$(IFS=,; echo "${pairs[*]}")"); else ARGS+=(--clear-env-vars); fi
    pairs=()
    for var in $(function_secrets "$name"); do pairs+=("${var%%=*}=$SQFX${var#*=}:latest"); done
    ARGS+=("--set-secrets=$(IFS=,; echo "${pairs[*]}")")
}

do_functions() {
    use_build_dir
    local name sizing=()
    for name in "${ALL_FUNCTIONS[@]}"; do
        selected "$name" || continue
        stage_function "$name"
        read -ra sizing <<<"$(function_sizing "$name")"
        ARGS=("$GCLOUD" functions deploy "$name" --project="$GCP_PROJECT" --region="$GCP_REGION"
            --gen2 --runtime=python311 --source="$BUILD_DIR/$name" --entry-point="$(entry_point "$name")"
            --trigger-http --allow-unauthenticated --timeout="$(function_timeout "$name")"
            "${sizing[@]}")
        if [[ -n ${GCP_SERVICE_ACCOUNT:-} ]]; then ARGS+=(--service-account="$GCP_SERVICE_ACCOUNT"); fi
        settings_args "$name"
        ARGS+=(--quiet)
        run "${ARGS[@]}"
    done
}

image_tag() {  # SFTQ_IMAGE_TAG, else the commit (marked -dirty-<time> when the tree has changes)
    local rev
    if [[ -n ${SFTQ_IMAGE_TAG:-} ]]; then printf '%s' "$SFTQ_IMAGE_TAG"; return; fi
    if rev=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null); then
        if [[ -n $(git -C "$ROOT" status --porcelain 2>/dev/null) ]]; then
            rev+=-dirty-$(date -u +%Y%m%d%H%M%S)
        fi
        printf '%s' "$rev"
    else
        date -u +%Y%m%d%H%M%S
    fi
}

# stage_image: the build context Cloud Build receives, and nothing else: the Dockerfile, the
# functions' code, docs/openapi.json, and constraints.txt pinning what was tested here.
stage_image() {
    local dir=$BUILD_DIR/image name
    rm -rf "$dir"
    mkdir -p "$dir/functions" "$dir/docs"
    cp Dockerfile pyproject.toml "$dir/"
    [[ ! -f .dockerignore ]] || cp .dockerignore "$dir/"
    cp -R "$FUNCTIONS_DIR/sftq_server" "$dir/functions/sftq_server"
    for name in "${ALL_FUNCTIONS[@]}"; do cp "$FUNCTIONS_DIR/$(entry_file "$name")" "$dir/functions/"; done
    find "$dir/functions" \( -name __pycache__ -o -name '*.pyc' -o -name .mypy_cache \) -prune -exec rm -rf {} +
    cp docs/openapi.json "$dir/docs/"
    {
        printf '# Generated by %s: the versions installed where it ran.\n' "$PROG"
        printf '%s\n' "$CONSTRAINTS"
    } >"$dir/constraints.txt"
    note "staged the image's build context in $dir"
}

# How a service runs the image. jobs-api, analytics and scheduler-tick run its CMD (the
# gateway under granian: each serves all three paths, but gets only its own function's
# settings and secrets, so only its own path has what it needs). webhook-deliver and
# jobs-stream run a server of their own from the same image:
# - webhook-deliver: the WSGI app of functions/webhook_deliver.py under granian; a few passes
#   at once, each mostly waiting on receivers;
# - jobs-stream: the ASGI app of functions/jobs_stream.py under uvicorn (the server the
#   stream's figures were measured on), one process, so one poll per second serves every
#   stream of the instance; shutdown gives open streams 8 of Cloud Run's 10 s, and clients
#   resume with Last-Event-ID.
service_command() {
    case $1 in
        webhook-deliver) echo --command=granian \
            --args=--interface,wsgi,--host,0.0.0.0,--port,8080,--workers,1,--blocking-threads,4,--no-ws,--factory,webhook_deliver:create_app ;;
        jobs-stream) echo --command=uvicorn \
            --args=jobs_stream:asgi_app,--factory,--host,0.0.0.0,--port,8080,--no-access-log,--ws,none,--lifespan,on,--timeout-graceful-shutdown,8 ;;
    esac
}
service_sizing() {
    case $1 in
        webhook-deliver) echo --cpu=1 --memory=512Mi --concurrency=4 ;;
        jobs-stream) echo --cpu=1 --memory=512Mi --concurrency=1000 ;;
        # 2 CPUs for granian's 2 processes x 2 threads, as measured (docs/performance.md).
        *) echo --cpu=2 --memory=1Gi --concurrency=16 ;;
    esac
}

# One image, one Cloud Run service per function.
do_services() {
    use_build_dir
    stage_image
    local image name sizing=() command=()
    image=$GCP_REGION-docker.pkg.dev/$GCP_PROJECT/sftq/sftq:$(image_tag)
    run_unless "$GCLOUD" artifacts repositories describe sftq --project="$GCP_PROJECT" \
        --location="$GCP_REGION" --quiet -- \
        "$GCLOUD" artifacts repositories create sftq --project="$GCP_PROJECT" --location="$GCP_REGION" \
        --repository-format=docker --quiet
    run "$GCLOUD" builds submit "$BUILD_DIR/image" --project="$GCP_PROJECT" --region="$GCP_REGION" \
        --tag="$image" --quiet
    for name in "${ALL_FUNCTIONS[@]}"; do
        selected "$name" || continue
        read -ra sizing <<<"$(service_sizing "$name")"
        read -ra command <<<"$(service_command "$name")"
        ARGS=("$GCLOUD" run deploy "sftq-$name" --project="$GCP_PROJECT" --region="$GCP_REGION"
            --image="$image" --port=8080 "${sizing[@]}"
            --timeout="$(function_timeout "$name")" "${command[@]}" --allow-unauthenticated)
        if [[ -n ${GCP_SERVICE_ACCOUNT:-} ]]; then ARGS+=(--service-account="$GCP_SERVICE_ACCOUNT"); fi
        settings_args "$name"
        ARGS+=(--quiet)
        run "${ARGS[@]}"
    done
}

tick_url() {
    if [[ -n ${SFTQ_TICK_URL:-} ]]; then
        printf '%s' "$SFTQ_TICK_URL"
    elif [[ -n ${SUPABASE_URL:-} ]]; then
        printf '%s/functions/v1/scheduler-tick' "${SUPABASE_URL%/}"
    else
        printf 'https://%s-%s.cloudfunctions.net/scheduler-tick' "$GCP_REGION" "$GCP_PROJECT"
    fi
}

deliver_url() {
    if [[ -n ${SFTQ_WEBHOOKS_DELIVER_URL:-} ]]; then
        printf '%s' "$SFTQ_WEBHOOKS_DELIVER_URL"
    elif [[ -n ${SUPABASE_URL:-} ]]; then
        printf '%s/functions/v1/webhook-deliver' "${SUPABASE_URL%/}"
    else
        printf 'https://%s-%s.cloudfunctions.net/webhook-deliver' "$GCP_REGION" "$GCP_PROJECT"
    fi
}

# Both jobs carry two-minute tokens of the tick secret, never the secret (cron/_tick_secrets.sql),
# and both scripts run as this one role, which keeps pg_net to itself (cron/_net_private.sql).
do_cron() {
    psql_for SUPABASE_DB_URL
    # The secret goes on psql's stdin; the scripts hand it to Vault as COPY data.
    run_cmd --stdin "$SFTQ_TICK_SECRET" "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 \
        -v "tick_url=$(tick_url)" -f cron/schedule_tick.sql
    run_cmd --stdin "$SFTQ_TICK_SECRET" "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 \
        -v "deliver_url=$(deliver_url)" -f cron/schedule_webhooks.sql
    run_cmd "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 -f cron/check_net_private.sql
}

do_unschedule() {
    psql_for SUPABASE_DB_URL
    run_cmd "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 -f cron/unschedule_tick.sql
    run_cmd "${PSQL_ENV[@]}" -- "$PSQL" "$PSQL_URL" -X -q -v ON_ERROR_STOP=1 -f cron/unschedule_webhooks.sql
}

# ---- main -------------------------------------------------------------------------------

ONLY=''
ARGS=()
STEPS=()
while (($#)); do
    case $1 in
        -n | --dry-run) DRY_RUN=1 ;;
        --only) (($# > 1)) || { usage >&2; exit 2; }; ONLY=$2; shift ;;
        --only=*) ONLY=${1#--only=} ;;
        -h | --help) usage; exit 0 ;;
        all) STEPS+=(db secrets services cron) ;;
        db | secrets | services | functions | cron | unschedule) STEPS+=("$1") ;;
        *) printf '%s: unknown argument: %s\n\n' "$PROG" "$1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if ((${#STEPS[@]} == 0)); then
    usage >&2
    exit 2
fi
if [[ -n $ONLY ]]; then
    [[ ${#STEPS[@]} == 1 && ${STEPS[0]} =~ ^(secrets|services|functions)$ ]] ||
        die "--only goes with a single secrets, services or functions step"
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
