# The three functions (jobs-api, analytics, scheduler-tick) behind one port, served by granian
# with the setup docs/performance.md recommends: RSGI, 2 worker processes (HTTP parsing in
# Rust). In each process POST /jobs waits on an event loop and the enqueues that arrive
# together share a transaction (group commit); every other route runs the WSGI gateway on a
# pool of threads (sftq_server/http/gateway_rsgi.py). Paths are the contract's: /functions/v1/<name>.
# The same image runs the two other functions with a command of their own (infra/deploy.sh
# passes it to Cloud Run): webhook-deliver under granian (webhook_deliver:create_app), and the
# live stream under uvicorn, ASGI (jobs_stream:asgi_app). cryptography seals and opens the
# webhooks' signing secrets (jobs-api, webhook-deliver).
#
# `infra/deploy.sh services` builds it with Cloud Build from a staged folder holding this file,
# functions/, docs/openapi.json and constraints.txt (the versions installed where the tests
# ran). `docker build .` at the repository root works as well, within pyproject's ranges.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app/functions

WORKDIR /app

# constraints.tx[t]: copied when present (a staged build), skipped at the repository root.
COPY pyproject.toml constraints.tx[t] ./
RUN pip install --no-cache-dir $(test -f constraints.txt && echo -c constraints.txt) \
        "psycopg[binary]>=3.1.18" "psycopg-pool>=3.2" "pydantic>=2.6" "httpx>=0.27" \
        "werkzeug>=3.0" "granian>=1.6" "uvicorn>=0.30" "cryptography>=42" \
        "prometheus_client>=0.20" \
    && useradd --system --no-create-home --uid 10001 sftq

COPY functions/ functions/
COPY docs/openapi.json docs/openapi.json
# Bytecode built once here: with PYTHONDONTWRITEBYTECODE every cold start would otherwise
# compile our modules from source again (about 40 ms of a jobs-api first request).
RUN python -m compileall -q functions/

USER sftq
EXPOSE 8080
# One process per core. create_app() reads the settings from the environment and refuses to
# start with a tick secret shorter than 32 characters.
CMD ["granian", "--interface", "rsgi", "--host", "0.0.0.0", "--port", "8080", \
     "--workers", "2", "--no-ws", \
     "--factory", "sftq_server.http.gateway_rsgi:create_app"]
