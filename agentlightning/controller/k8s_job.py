"""From a rollout's Jinja template to the Job the controller creates: render, check, shape.

The template sees `input`, `job_name`, `rollout_id`, `attempt_id`, `is_train` and `metadata`,
and has a `yaml_escape` filter that turns any value into a safe YAML string scalar. It must
render exactly one batch/v1 Job; the controller then sets the name, namespace and labels,
`backoffLimit: 0`, `restartPolicy: Never`, `ttlSecondsAfterFinished`, `activeDeadlineSeconds`
and the three `AGL_*` variables in every container.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson
import yaml
from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, Undefined, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from agentlightning.controller.runner import attempt_number

MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agentlightning"
ROLLOUT_LABEL = "agentlightning.io/rollout-id"
ATTEMPT_LABEL = "agentlightning.io/attempt-id"
TEMPLATE_VARIABLES = ("input", "job_name", "rollout_id", "attempt_id", "is_train", "metadata")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class JobSpecError(ValueError):
    """The template cannot give a Job; the message says why (it becomes the rollout's error)."""


def job_name(rollout_id: str, attempt_id: str) -> str:
    """A DNS-1123 name, unique per attempt and the same every time for it (at most 63 characters)."""
    slug = re.sub(r"[^a-z0-9]+", "-", rollout_id.lower()).strip("-")[:30].strip("-") or "rollout"
    digest = hashlib.sha256(f"{rollout_id}\0{attempt_id}".encode()).hexdigest()[:8]
    return f"agl-{slug}-{attempt_number(attempt_id)}-{digest}"


def label_value(value: str) -> str:
    """The value itself when Kubernetes accepts it as a label value, else a stable hash of it."""
    if _LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def yaml_escape(value: Any) -> str:
    """A double-quoted YAML scalar: strings as they are, other values as their JSON text."""
    if isinstance(value, Undefined):
        str(value)  # raises UndefinedError naming what is missing
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return orjson.dumps(text).decode()  # a JSON string is a valid double-quoted YAML scalar


_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
_ENV.filters["yaml_escape"] = yaml_escape


def render_job(template: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """Render the template and check it is exactly one batch/v1 Job with containers."""
    try:
        text = _ENV.from_string(template).render(**context)
    except TemplateSyntaxError as exc:
        raise JobSpecError(f"job_template line {exc.lineno}: {exc.message}") from None
    except UndefinedError as exc:
        raise JobSpecError(
            f"job_template: {exc.message} (the template can use {', '.join(TEMPLATE_VARIABLES)})"
        ) from None
    except TemplateError as exc:
        raise JobSpecError(f"job_template: {type(exc).__name__}: {exc}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise JobSpecError(f"job_template did not render valid YAML: {exc}") from None
    if len(documents) != 1:
        raise JobSpecError(
            f"job_template must render exactly one Job; it rendered {len(documents)} documents"
        )
    job = documents[0]
    if not isinstance(job, dict):
        raise JobSpecError(f"job_template must render a Job object; it rendered a {type(job).__name__}")
    if job.get("kind") != "Job" or job.get("apiVersion") != "batch/v1":
        raise JobSpecError(
            f"job_template must render a batch/v1 Job; it rendered kind={job.get('kind')!r} "
            f"apiVersion={job.get('apiVersion')!r}"
        )
    spec = job.get("spec")
    pod = spec.get("template") if isinstance(spec, dict) else None
    pod_spec = pod.get("spec") if isinstance(pod, dict) else None
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise JobSpecError("job_template: the Job needs spec.template.spec.containers (a non-empty list)")
    return job


def _mapping(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def shape_job(
    job: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    rollout_id: str,
    attempt_id: str,
    timeout_seconds: float,
    ttl_after_finished: int,
    env: Mapping[str, str],
) -> dict[str, Any]:
    """The rendered Job with everything the controller owns set (a copy)."""
    rendered: dict[str, Any] = copy.deepcopy(dict(job))
    labels = {
        MANAGED_BY_KEY: MANAGED_BY,
        ROLLOUT_LABEL: label_value(rollout_id),
        ATTEMPT_LABEL: label_value(attempt_id),
    }
    annotations = {ROLLOUT_LABEL: rollout_id, ATTEMPT_LABEL: attempt_id}  # exact ids, whatever their form
    metadata = _mapping(rendered, "metadata")
    metadata.pop("generateName", None)
    metadata["name"] = name
    metadata["namespace"] = namespace
    _mapping(metadata, "labels").update(labels)
    _mapping(metadata, "annotations").update(annotations)
    spec = _mapping(rendered, "spec")
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout_seconds))
    if ttl_after_finished >= 0:
        spec["ttlSecondsAfterFinished"] = ttl_after_finished
    else:
        spec.pop("ttlSecondsAfterFinished", None)
    template = _mapping(spec, "template")
    pod_metadata = _mapping(template, "metadata")
    _mapping(pod_metadata, "labels").update(labels)
    _mapping(pod_metadata, "annotations").update(annotations)
    pod_spec = _mapping(template, "spec")
    pod_spec["restartPolicy"] = "Never"
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            kept = [
                e for e in container.get("env") or [] if not (isinstance(e, dict) and e.get("name") in env)
            ]
            container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return rendered
