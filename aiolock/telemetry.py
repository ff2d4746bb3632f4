"""Metrics and traces from lock events: OpenTelemetry and Prometheus, ready to plug in.

::

    from aiolock.telemetry import OpenTelemetry, Prometheus

    LockManager(nodes, on_event=[OpenTelemetry(), Prometheus()])

``OpenTelemetry`` needs ``pip install aiolock-redis[otel]`` (``opentelemetry-api`` only, as
OpenTelemetry asks of libraries: without an SDK configured by the application every
instrument is a no-op). ``Prometheus`` needs ``pip install aiolock-redis[prometheus]``.

Both record the same figures:

* the time spent acquiring (a histogram in seconds, by outcome: ``acquired``,
  ``timeout``, ``quorum_error``) and the time held (``released``, ``lost``);
* counters of acquisitions, timeouts, losses and quorum errors.

Lock names are high-cardinality (``order:42``): they are left out unless ``name``
maps a lock name to a label of bounded cardinality (say ``lambda n: n.split(":")[0]``,
or a ``synchronized`` template).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ._core.events import LockEvent

__all__ = ["OpenTelemetry", "Prometheus"]

#: Which events are about acquiring, and which about holding.
_ACQUIRING = frozenset({"acquired", "timeout", "quorum_error"})
_HOLDING = frozenset({"released", "lost"})
#: The counter of each counted event.
_COUNTED = {
    "acquired": "acquisitions",
    "timeout": "timeouts",
    "lost": "losses",
    "quorum_error": "quorum_errors",
}


def _missing(extra: str, module: str) -> ImportError:
    return ImportError(f"aiolock.telemetry needs {module}: pip install aiolock-redis[{extra}]")


class OpenTelemetry:
    """An ``on_event`` hook recording OpenTelemetry metrics and a span per acquire.

    Instruments (meter ``aiolock``): histograms ``aiolock.acquire.duration`` and
    ``aiolock.hold.duration`` (s, attribute ``aiolock.outcome``), counters
    ``aiolock.acquisitions``, ``aiolock.timeouts``, ``aiolock.losses`` and
    ``aiolock.quorum_errors``. Each acquire is also a span ``aiolock.acquire`` (from
    the start of the wait to its outcome; attributes: outcome, wait, failed nodes).
    ``meter_provider`` / ``tracer_provider``: default the global ones.
    """

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        name: Callable[[str], str] | None = None,
    ) -> None:
        try:
            from opentelemetry import metrics, trace  # noqa: PLC0415 - optional
        except ImportError:
            raise _missing("otel", "opentelemetry-api") from None
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("aiolock")
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("aiolock")
        self._name = name
        self._acquire = meter.create_histogram(
            "aiolock.acquire.duration", unit="s", description="Time spent acquiring a lock"
        )
        self._hold = meter.create_histogram(
            "aiolock.hold.duration", unit="s", description="Time a lock was held"
        )
        self._counters = {
            kind: meter.create_counter(f"aiolock.{what}", description=f"Lock {what}")
            for kind, what in _COUNTED.items()
        }

    def __call__(self, event: LockEvent) -> None:
        """Record ``event`` (the ``on_event`` hook)."""
        attributes: dict[str, str | int | float] = {"aiolock.outcome": event.kind}
        if self._name is not None:
            attributes["aiolock.lock"] = self._name(event.name)
        if event.kind in _ACQUIRING:
            self._acquire.record(event.seconds, attributes)
            self._span(event, attributes)
        elif event.kind in _HOLDING:
            self._hold.record(event.seconds, attributes)
        counter = self._counters.get(event.kind)
        if counter is not None:
            counter.add(1, attributes)

    def _span(self, event: LockEvent, attributes: dict[str, str | int | float]) -> None:
        end = time.time_ns()
        span = self._tracer.start_span(
            "aiolock.acquire", start_time=end - int(event.seconds * 1e9), attributes=attributes
        )
        span.set_attribute("aiolock.wait", event.seconds)
        errors = getattr(event.error, "errors", None)
        if errors:
            span.set_attribute("aiolock.nodes_failed", len(errors))
        if event.error is not None:
            span.record_exception(event.error)
        span.end(end_time=end)


class Prometheus:
    """An ``on_event`` hook updating ``prometheus_client`` metrics.

    ``aiolock_acquire_seconds`` and ``aiolock_hold_seconds`` (histograms, label
    ``outcome``), ``aiolock_acquisitions_total``, ``aiolock_timeouts_total``,
    ``aiolock_losses_total`` and ``aiolock_quorum_errors_total``; with ``name``, also
    the label ``lock``. ``registry``: default ``prometheus_client.REGISTRY`` (make one
    ``Prometheus`` per registry: the metrics are registered once).
    """

    def __init__(self, *, registry: Any = None, name: Callable[[str], str] | None = None) -> None:
        try:
            import prometheus_client  # noqa: PLC0415 - optional
        except ImportError:
            raise _missing("prometheus", "prometheus_client") from None
        if registry is None:
            registry = prometheus_client.REGISTRY
        self._name = name
        labels = ("outcome", "lock") if name is not None else ("outcome",)
        self._acquire = prometheus_client.Histogram(
            "aiolock_acquire_seconds", "Time spent acquiring a lock", labels, registry=registry
        )
        self._hold = prometheus_client.Histogram(
            "aiolock_hold_seconds", "Time a lock was held", labels, registry=registry
        )
        self._counters = {
            kind: prometheus_client.Counter(
                f"aiolock_{what}", f"Lock {what}", labels, registry=registry
            )
            for kind, what in _COUNTED.items()
        }

    def __call__(self, event: LockEvent) -> None:
        """Record ``event`` (the ``on_event`` hook)."""
        labels = [event.kind] if self._name is None else [event.kind, self._name(event.name)]
        if event.kind in _ACQUIRING:
            self._acquire.labels(*labels).observe(event.seconds)
        elif event.kind in _HOLDING:
            self._hold.labels(*labels).observe(event.seconds)
        counter = self._counters.get(event.kind)
        if counter is not None:
            counter.labels(*labels).inc()
