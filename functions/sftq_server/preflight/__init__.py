"""Pre-flight: what the queue can learn about a job before it waits, so that a job bound to
fail at submission fails at enqueue instead.

shape: the fireworks_payload against Fireworks' create schema for its kind (no network).
schema: that schema, generated from Fireworks' SDK and checked in.
resources: the dataset, evaluator and models the payload names, asked of Fireworks (and an
  SFT job's cost estimate); at enqueue within a budget, else by the tick while the job waits.
"""

from sftq_server.preflight.shape import Finding, ShapeReport, check_shape, findings_json

__all__ = ["Finding", "ShapeReport", "check_shape", "findings_json"]
