"""Fixture tools, prompts and resources that the MCP conformance suite calls by fixed names.

Test-only. ``register_conformance_fixtures`` is passed as ``configure_mcp`` to the production
``create_app`` by ``tests/support/conformance/serve_profile.py``; nothing under ``api/`` imports this
module, so the production server never lists these names. Written from the scenario
descriptions of ``@modelcontextprotocol/conformance`` (see /work/shared/reference §3f, §7).

Every interactive fixture follows the server rules the product tools follow too: it only asks
for input the client declared a capability for (else ``-32021``), re-asks instead of failing when
an answer is missing or malformed, and keeps its progress in ``requestState``, which the SDK seals
under the server's key ring (so a tampered state is rejected before the fixture runs).
"""

import base64
import json
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import (
    AudioContent,
    CallToolResult,
    ClientCapabilities,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    InputResponses,
    ListRootsRequest,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)
from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import Field

# A 1x1 PNG and a 44-byte silent WAV header.
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_SILENT = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="

Capability = Literal["elicitation", "sampling", "roots"]


def _declared(ctx: Context) -> set[Capability]:
    capabilities = ctx.client_capabilities or ClientCapabilities()
    declared: set[Capability] = set()
    if capabilities.elicitation is not None:
        declared.add("elicitation")
    if capabilities.sampling is not None:
        declared.add("sampling")
    if capabilities.roots is not None:
        declared.add("roots")
    return declared


def _require(ctx: Context, *needed: Capability) -> None:
    missing = [name for name in needed if name not in _declared(ctx)]
    if missing:
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"This tool needs the client capabilities: {', '.join(missing)}",
            data={"requiredCapabilities": {name: {} for name in missing}},
        )


def _ask(message: str, field: str) -> ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(question: str) -> CreateMessageRequest:
    return CreateMessageRequest(
        params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=question))], max_tokens=50
        )
    )


def _list_roots() -> ListRootsRequest:
    return ListRootsRequest()


def _answer(responses: InputResponses | None, key: str, field: str) -> str | None:
    """The accepted, non-empty string ``field`` of form answer ``key``; ``None`` for anything else."""
    answer = (responses or {}).get(key)
    if not isinstance(answer, ElicitResult) or answer.action != "accept" or not answer.content:
        return None
    value = answer.content.get(field)
    return value if isinstance(value, str) and value else None


def _sampled_text(responses: InputResponses | None, key: str) -> str | None:
    answer = (responses or {}).get(key)
    if not isinstance(answer, CreateMessageResult):
        return None
    content = answer.content
    return content.text if isinstance(content, TextContent) else "(non-text completion)"


def _roots(responses: InputResponses | None, key: str) -> list[str] | None:
    answer = (responses or {}).get(key)
    return [str(root.uri) for root in answer.roots] if isinstance(answer, ListRootsResult) else None


def _greet_or_ask_name(ctx: Context, greeting: str) -> str | InputRequiredResult:
    """``greeting`` with ``{name}`` filled in from form answer ``user_name``; until it carries a name, ask for one."""
    name = _answer(ctx.input_responses, "user_name", "name")
    if name is not None:
        return greeting.format(name=name)
    return InputRequiredResult(input_requests={"user_name": _ask("What is your name?", "name")})


def _report_or_sample(ctx: Context, key: str, question: str, report: str) -> str | InputRequiredResult:
    """``report`` with ``{text}`` filled in from the model's answer ``key``; until there is one, ask ``question``."""
    text = _sampled_text(ctx.input_responses, key)
    if text is not None:
        return report.format(text=text)
    return InputRequiredResult(input_requests={key: _sample(question)})


def _state(ctx: Context) -> dict[str, object]:
    """The plaintext state of this flow (already unsealed and verified by the SDK)."""
    if not ctx.request_state:
        return {}
    try:
        state = json.loads(ctx.request_state)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def register_conformance_fixtures(mcp: MCPServer) -> None:
    """Register every fixture the 2026-07-28 server scenarios call."""
    _register_content_tools(mcp)
    _register_input_required_tools(mcp)
    _register_diagnostic_tools(mcp)
    _register_resources(mcp)
    _register_prompts(mcp)


def _register_content_tools(mcp: MCPServer) -> None:
    @mcp.tool(name="test_simple_text", description="Returns a fixed text item.")
    async def simple_text() -> str:
        return "This is a simple text response for testing."

    @mcp.tool(name="test_image_content", description="Returns a 1x1 PNG image item.")
    async def image_content() -> CallToolResult:
        return CallToolResult(content=[ImageContent(type="image", data=PNG_1X1, mime_type="image/png")])

    @mcp.tool(name="test_audio_content", description="Returns a short WAV audio item.")
    async def audio_content() -> CallToolResult:
        return CallToolResult(content=[AudioContent(type="audio", data=WAV_SILENT, mime_type="audio/wav")])

    @mcp.tool(name="test_embedded_resource", description="Returns an embedded text resource.")
    async def embedded_resource() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        )
        return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])

    @mcp.tool(name="test_multiple_content_types", description="Returns text, an image and an embedded resource.")
    async def multiple_content_types() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://mixed-content-resource", mime_type="application/json", text='{"test":"data","value":123}'
        )
        return CallToolResult(
            content=[
                TextContent(type="text", text="Multiple content types test:"),
                ImageContent(type="image", data=PNG_1X1, mime_type="image/png"),
                EmbeddedResource(type="resource", resource=resource),
            ]
        )

    @mcp.tool(name="test_error_handling", description="Always fails with a tool error (isError: true).")
    async def error_handling() -> str:
        raise ToolError("This tool intentionally returns an error for testing")

    @mcp.tool(
        name="test_header_param",
        description="Echoes a region that clients also send as the Mcp-Param-Region header (x-mcp-header).",
    )
    async def header_param(
        region: Annotated[str, Field(description="A region code", json_schema_extra={"x-mcp-header": "Region"})],
    ) -> str:
        return f"Region: {region}"

    @mcp.tool(name="test_tool_with_progress", description="Reports progress 0, 50 and 100 of 100, then returns.")
    async def tool_with_progress(ctx: Context) -> str:
        for progress in (0, 50, 100):
            await ctx.report_progress(progress, total=100, message=f"step {progress} of 100")
        return "Progress reported: 0, 50, 100 of 100"


def _register_input_required_tools(mcp: MCPServer) -> None:
    @mcp.tool(
        name="test_input_required_result_elicitation",
        description="Asks for your name (form elicitation key user_name), then greets you.",
    )
    async def elicitation(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        # Completes from the answer alone, so a first call that already carries it works too.
        return _greet_or_ask_name(ctx, "Hello, {name}!")

    @mcp.tool(
        name="test_input_required_result_sampling",
        description="Asks the client's model one question (sampling), then reports the answer.",
    )
    async def sampling(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "sampling")
        return _report_or_sample(ctx, "capital", "What is the capital of France?", "The model answered: {text}")

    @mcp.tool(
        name="test_input_required_result_list_roots",
        description="Asks the client for its roots, then lists them.",
    )
    async def list_roots(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "roots")
        roots = _roots(ctx.input_responses, "roots")
        if roots is not None:
            return f"{len(roots)} root(s): {', '.join(roots)}"
        return InputRequiredResult(input_requests={"roots": _list_roots()})

    @mcp.tool(
        name="test_input_required_result_request_state",
        description="Asks for a go-ahead and carries its progress in requestState; completes only with that state.",
    )
    async def request_state(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        answer = (ctx.input_responses or {}).get("go_ahead")
        if _state(ctx).get("step") == "asked" and isinstance(answer, ElicitResult):
            return f"State verified; the answer was {answer.action}."
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        return InputRequiredResult(
            input_requests={
                "go_ahead": ElicitRequest(params=ElicitRequestFormParams(message="Go ahead?", requested_schema=schema))
            },
            request_state=json.dumps({"step": "asked"}),
        )

    @mcp.tool(
        name="test_input_required_result_multiple_inputs",
        description="Asks for a form answer, a model completion and the roots in one round.",
    )
    async def multiple_inputs(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation", "sampling", "roots")
        responses = ctx.input_responses
        name = _answer(responses, "user_name", "name")
        text = _sampled_text(responses, "greeting")
        roots = _roots(responses, "roots")
        if _state(ctx).get("step") == "asked" and name is not None and text is not None and roots is not None:
            return f"name={name}; model={text}; roots={len(roots)}"
        return InputRequiredResult(
            input_requests={
                "user_name": _ask("What is your name?", "name"),
                "greeting": _sample("Write a one-line greeting."),
                "roots": _list_roots(),
            },
            request_state=json.dumps({"step": "asked"}),
        )

    @mcp.tool(
        name="test_input_required_result_multi_round",
        description="Asks two questions in two rounds; the first answer travels in requestState.",
    )
    async def multi_round(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        state = _state(ctx)
        if state.get("round") == 2:
            color = _answer(ctx.input_responses, "step2", "color")
            if color is not None:
                return f"{state.get('name')} likes {color}."
            return _multi_round_second(str(state.get("name")))
        name = _answer(ctx.input_responses, "step1", "name") if state.get("round") == 1 else None
        if name is not None:
            return _multi_round_second(name)
        return InputRequiredResult(
            input_requests={"step1": _ask("Step 1: What is your name?", "name")},
            request_state=json.dumps({"round": 1}),
        )

    @mcp.tool(
        name="test_input_required_result_tampered_state",
        description="Round 1 hands out a sealed requestState; any altered state is rejected by the server.",
    )
    async def tampered_state(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        name = _answer(ctx.input_responses, "user_name", "name")
        if _state(ctx).get("step") == "asked" and name is not None:
            return f"Untampered state accepted; hello, {name}!"
        return InputRequiredResult(
            input_requests={"user_name": _ask("What is your name?", "name")},
            request_state=json.dumps({"step": "asked"}),
        )

    @mcp.tool(
        name="test_input_required_result_capabilities",
        description="Asks for input through whichever of elicitation or sampling the client declared.",
    )
    async def capabilities(ctx: Context) -> str | InputRequiredResult:
        declared = _declared(ctx)
        if "elicitation" in declared:
            return _greet_or_ask_name(ctx, "Asked by form; hello, {name}!")
        if "sampling" in declared:
            return _report_or_sample(
                ctx, "name_guess", "Suggest a name for a test user.", "Asked the model; it said: {text}"
            )
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="This tool needs the elicitation or the sampling client capability",
            data={"requiredCapabilities": {"elicitation": {}}},
        )


def _multi_round_second(name: str) -> InputRequiredResult:
    return InputRequiredResult(
        input_requests={"step2": _ask("Step 2: What is your favorite color?", "color")},
        request_state=json.dumps({"round": 2, "name": name}),
    )


def _register_diagnostic_tools(mcp: MCPServer) -> None:
    @mcp.tool(name="test_missing_capability", description="Needs the sampling capability; -32021 without it.")
    async def missing_capability(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "sampling")
        return _report_or_sample(ctx, "probe", "Say hello.", "The model answered: {text}")

    @mcp.tool(
        name="test_streaming_elicitation",
        description="Asks a question the 2026-07-28 way: an input_required result, never a server request.",
    )
    async def streaming_elicitation(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        await ctx.report_progress(0, total=1, message="about to ask")
        return _greet_or_ask_name(ctx, "Hello, {name}!")

    @mcp.tool(
        name="test_logging_tool",
        description="Logs three messages; they reach the client only if it asked for a log level.",
    )
    async def logging_tool(ctx: Context) -> str:
        for step in ("started", "working", "finished"):
            await ctx.info(f"logging tool {step}")
        return "Logged three messages."

    @mcp.tool(
        name="test_trigger_tool_change",
        description="Tells open subscriptions/listen streams that the tool list changed.",
    )
    async def trigger_tool_change(ctx: Context) -> str:
        # Notify only: lists must not change as a side effect of other requests (spec, caching).
        await ctx.notify_tools_changed()
        return "tools/list_changed sent"

    @mcp.tool(
        name="test_trigger_prompt_change",
        description="Tells open subscriptions/listen streams that the prompt list changed.",
    )
    async def trigger_prompt_change(ctx: Context) -> str:
        await ctx.notify_prompts_changed()
        return "prompts/list_changed sent"


def _register_resources(mcp: MCPServer) -> None:
    @mcp.resource(
        "test://static-text", name="static-text", description="A fixed text resource.", mime_type="text/plain"
    )
    async def static_text() -> str:
        return "This is the content of the static text resource."

    @mcp.resource("test://static-binary", name="static-binary", description="A 1x1 PNG image.", mime_type="image/png")
    async def static_binary() -> bytes:
        return base64.b64decode(PNG_1X1)

    @mcp.resource(
        "test://template/{id}/data",
        name="template-data",
        description="JSON data for any id.",
        mime_type="application/json",
    )
    async def template_data(id: str) -> str:  # the template variable is called id
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @mcp.completion()  # type: ignore[untyped-decorator,no-untyped-call]  # the SDK decorator is untyped
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        candidates = ["test", "testing", "tested", "value"]
        values = [value for value in candidates if value.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)


def _register_prompts(mcp: MCPServer) -> None:
    @mcp.prompt(name="test_simple_prompt", description="A prompt without arguments.")
    async def simple_prompt() -> list[UserMessage]:
        return [UserMessage("This is a simple prompt for testing.")]

    @mcp.prompt(name="test_prompt_with_arguments", description="A prompt that repeats its two arguments.")
    async def prompt_with_arguments(
        arg1: Annotated[str, Field(description="First argument")],
        arg2: Annotated[str, Field(description="Second argument")],
    ) -> list[UserMessage]:
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @mcp.prompt(name="test_prompt_with_embedded_resource", description="A prompt that embeds a resource.")
    async def prompt_with_embedded_resource(
        resourceUri: Annotated[str, Field(description="URI of the resource to embed")],  # noqa: N803  # wire name
    ) -> list[UserMessage]:
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(EmbeddedResource(type="resource", resource=resource)),
            UserMessage("Please process the embedded resource above."),
        ]

    @mcp.prompt(name="test_prompt_with_image", description="A prompt that includes an image.")
    async def prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(ImageContent(type="image", data=PNG_1X1, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    @mcp.prompt(
        name="test_input_required_result_prompt",
        description="Asks what context to use (form elicitation key user_context), then builds the prompt.",
    )
    async def input_required_prompt(ctx: Context) -> list[UserMessage] | InputRequiredResult:
        _require(ctx, "elicitation")
        context = _answer(ctx.input_responses, "user_context", "context")
        if context is not None:
            return [UserMessage(f"Use this context: {context}")]
        return InputRequiredResult(
            input_requests={"user_context": _ask("What context should the prompt use?", "context")}
        )
