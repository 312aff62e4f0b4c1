"""OpenTelemetry traces, configured by the standard ``OTEL_*`` environment variables (read by ``Settings``).

The SDK already opens a span per MCP request (``tools/call cart_view``…); this module gives those spans
somewhere to go and adds one span per database statement under them (:func:`trace_statements`).

Exporters come from ``OTEL_TRACES_EXPORTER`` (comma-separated): ``console`` (JSON on stdout), ``otlp``
(OTLP over HTTP/protobuf, ``OTEL_EXPORTER_OTLP_ENDPOINT``…; needs ``pip install 'coatcheck[otlp]'``), or
any other name an installed package registers as an ``opentelemetry_traces_exporter`` entry point.
Unlike the specification's default (``otlp``), no variable means no tracing: an unset
``OTEL_TRACES_EXPORTER`` or ``none`` costs nothing per request. ``OTEL_SERVICE_NAME`` defaults to
``coatcheck``; sampling (``OTEL_TRACES_SAMPLER``), batching (``OTEL_BSP_*``) and resource attributes
follow the SDK's own variables.

Spans carry no secret: statement spans hold the SQL text with its placeholders, never the bound values.
"""

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import event
from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from api.settings import Settings

_ENTRY_POINTS = "opentelemetry_traces_exporter"
_MAX_QUERY_TEXT = 2000


class TracingConfigError(Exception):
    """The ``OTEL_*`` variables name an exporter that cannot be used; the message says which and why."""


def _exporter(name: str, settings: "Settings") -> SpanExporter:
    if name == "otlp":
        protocol = settings.otel_exporter_otlp_traces_protocol or settings.otel_exporter_otlp_protocol
        if protocol != "http/protobuf":
            raise TracingConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; use http/protobuf")
        name = "otlp_proto_http"
    found = entry_points(group=_ENTRY_POINTS, name=name)
    if not found:
        hint = " (install coatcheck[otlp])" if name == "otlp_proto_http" else ""
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed{hint}")
    exporter_class: Any = next(iter(found)).load()
    exporter: SpanExporter = exporter_class()
    return exporter


def configure_tracing(settings: "Settings") -> TracerProvider | None:
    """Install the process's tracer provider from the ``OTEL_*`` settings; ``None`` when tracing is off.

    Raises:
        TracingConfigError: an exporter is unknown or not installed.
    """
    names = [part.strip() for part in settings.otel_traces_exporter.split(",") if part.strip()]
    if settings.otel_sdk_disabled or not names or names == ["none"]:
        return None
    exporters = [_exporter(name, settings) for name in names if name != "none"]
    resource = Resource.create({SERVICE_NAME: settings.otel_service_name} if settings.otel_service_name else {})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):  # the SDK's placeholder
        resource = resource.merge(Resource({SERVICE_NAME: "coatcheck"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def trace_statements(sync_engine: Engine, provider: trace.TracerProvider) -> None:
    """Open a client span around every statement ``sync_engine`` runs, a child of the request's span."""
    tracer = provider.get_tracer("coatcheck.store")

    def before(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        operation = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "SQL"
        context._coatcheck_span = tracer.start_span(
            f"db {operation}",
            kind=SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.operation.name": operation,
                "db.query.text": statement[:_MAX_QUERY_TEXT],
            },
        )

    def after(_conn: Any, _cursor: Any, _statement: str, _params: Any, context: Any, _many: bool) -> None:
        span = getattr(context, "_coatcheck_span", None)
        if span is not None:
            span.end()

    def failed(exception_context: Any) -> None:
        span = getattr(exception_context.execution_context, "_coatcheck_span", None)
        if span is not None:
            # The class only: a driver message can quote a value.
            span.set_status(StatusCode.ERROR, type(exception_context.original_exception).__name__)
            span.end()

    event.listen(sync_engine, "before_cursor_execute", before)
    event.listen(sync_engine, "after_cursor_execute", after)
    event.listen(sync_engine, "handle_error", failed)
