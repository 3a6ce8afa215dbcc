"""Property-based fuzzing of the Gateway's OpenAPI surface: no input may produce a 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from agentlightning.server.app import create_app

# In-memory store: its open() is a no-op, so the app works without running its lifespan.
# Long-polls capped short so that fuzzed wait_seconds do not stall the run.
app = create_app({"store": {"url": "memory://"}, "long_poll_max_seconds": 0.05})
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
