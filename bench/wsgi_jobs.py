"""The jobs-api as a plain WSGI app, for gunicorn and granian in the benchmark:

    gunicorn --pythonpath functions,bench wsgi_jobs:app

Settings come from the environment like in production (DATABASE_URL, SFTQ_DB_POOL_MAX).
Logging is set up by bench/site/sitecustomize.py, the same way for every server measured.
"""

from __future__ import annotations

from sftq_server.core.settings import Settings
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app

app = wsgi_app(make_jobs_api(Settings.from_env()))
