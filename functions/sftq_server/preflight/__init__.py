"""Pre-flight: what the queue can learn about a job before it waits, so that a job bound to
fail at submission fails at enqueue instead.

shape: the fireworks_payload against Fireworks' create schema for its kind (no network).
schema: that schema, generated from Fireworks' SDK and checked in.
"""

from sftq_server.preflight.shape import Finding, ShapeReport, check_shape

__all__ = ["Finding", "ShapeReport", "check_shape"]
