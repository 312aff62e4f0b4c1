// Drives Coatcheck with the official TypeScript MCP client (@modelcontextprotocol/client 2.x).
//
// Test-only; run by tests/interop/test_typescript_client.py (installed with tests/support/node.py):
//   MCP_URL=http://127.0.0.1:8000/mcp MCP_TOKEN=<bearer> node ts_client.mjs <scenario>
// Scenarios: "cart-flow" (catalog and cart tools), "checkout" (the MRTR checkout rounds), and
// "legacy-default" (the client's default options, which negotiate 2025-11-25 via initialize).
// The script only drives the client and records what it saw; it prints one JSON transcript on
// stdout and the Python test makes the assertions. Any client-side exception is recorded too.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const scenario = process.argv[2];
const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
const scenarios = { 'cart-flow': cartFlow, checkout, 'legacy-default': legacyDefault };
if (!url || !token || !(scenario in scenarios)) {
  console.error(`usage: MCP_URL=... MCP_TOKEN=... node ts_client.mjs ${Object.keys(scenarios).join('|')}`);
  process.exit(2);
}

const transcript = { scenario, steps: [], elicitations: [] };

function record(step, result) {
  transcript.steps.push({
    step,
    isError: result.isError === true,
    resultType: result.resultType,
    structuredContent: result.structuredContent ?? null,
    text: (result.content ?? []).filter((item) => item.type === 'text').map((item) => item.text).join('\n'),
  });
  return result;
}

async function connect({ answer, negotiate = true }) {
  const options = { capabilities: { elicitation: { form: {} } } };
  if (negotiate) {
    // 'auto' probes server/discover and falls back to initialize; we expect the modern era.
    // Without this option the client defaults to 'legacy' (a 2025-11-25 initialize handshake).
    options.versionNegotiation = { mode: 'auto' };
  }
  const client = new Client({ name: 'coatcheck-interop-ts', version: '1.0.0' }, options);
  // One handler serves every embedded elicitation of an input_required result (MRTR).
  client.setRequestHandler('elicitation/create', async (request) => {
    transcript.elicitations.push(request.params);
    return answer(request.params);
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  transcript.protocolVersion = client.getNegotiatedProtocolVersion();
  transcript.era = client.getProtocolEra();
  transcript.serverVersion = client.getServerVersion();
  return client;
}

async function call(client, step, name, args) {
  return record(step, await client.callTool({ name, arguments: args }));
}

async function cartFlow() {
  const client = await connect({ answer: () => ({ action: 'cancel' }) });
  try {
    transcript.tools = (await client.listTools()).tools.map((tool) => tool.name);
    const search = await call(client, 'catalog_search', 'catalog_search', { query: '', limit: 5 });
    const [first, second] = search.structuredContent.products;
    const created = await call(client, 'cart_create', 'cart_create', {});
    const cartId = created.structuredContent.cart_id;
    transcript.cartId = cartId;
    transcript.skus = [first.sku, second.sku];
    await call(client, 'cart_set_item', 'cart_set_item', { cart_id: cartId, sku: first.sku, quantity: 2 });
    await call(client, 'cart_set_item (second sku)', 'cart_set_item', { cart_id: cartId, sku: second.sku, quantity: 1 });
    await call(client, 'cart_set_item (remove second)', 'cart_set_item', { cart_id: cartId, sku: second.sku, quantity: 0 });
    await call(client, 'cart_view', 'cart_view', { cart_id: cartId });
    await call(client, 'cart_list', 'cart_list', {});
    await call(client, 'cart_delete', 'cart_delete', { cart_id: cartId });
    await call(client, 'cart_view (deleted)', 'cart_view', { cart_id: cartId });
    await call(client, 'cart_list (after delete)', 'cart_list', {});
  } finally {
    await client.close();
  }
}

async function checkout() {
  let decision = { action: 'accept', content: { confirm: true } };
  const client = await connect({ answer: () => decision });
  try {
    // Listing first makes the client validate structuredContent against each tool's outputSchema
    // (it validates only against a tools/list it holds; the Python client fetches one itself).
    transcript.tools = (await client.listTools()).tools.map((tool) => tool.name);
    const search = await call(client, 'catalog_search', 'catalog_search', { query: '', limit: 1 });
    const [product] = search.structuredContent.products;
    const created = await call(client, 'cart_create', 'cart_create', {});
    const cartId = created.structuredContent.cart_id;
    transcript.cartId = cartId;
    await call(client, 'cart_set_item', 'cart_set_item', { cart_id: cartId, sku: product.sku, quantity: 3 });
    await call(client, 'cart_view', 'cart_view', { cart_id: cartId });
    // Both rounds happen inside this one call: the client answers the embedded elicitation
    // through the handler above and retries with inputResponses and the echoed requestState.
    await call(client, 'cart_checkout', 'cart_checkout', { cart_id: cartId });
    await call(client, 'cart_view (after checkout)', 'cart_view', { cart_id: cartId });

    // The user says no this time: no order, the cart stays open.
    decision = { action: 'decline' };
    const other = await call(client, 'cart_create (declined)', 'cart_create', {});
    const otherId = other.structuredContent.cart_id;
    await call(client, 'cart_set_item (declined)', 'cart_set_item', { cart_id: otherId, sku: product.sku, quantity: 1 });
    await call(client, 'cart_checkout (declined)', 'cart_checkout', { cart_id: otherId });
    await call(client, 'cart_view (declined)', 'cart_view', { cart_id: otherId });
  } finally {
    await client.close();
  }
}

async function legacyDefault() {
  const client = await connect({ answer: () => ({ action: 'accept', content: { confirm: true } }), negotiate: false });
  try {
    transcript.tools = (await client.listTools()).tools.map((tool) => tool.name);
    const search = await call(client, 'catalog_search', 'catalog_search', { query: '', limit: 1 });
    const [product] = search.structuredContent.products;
    const created = await call(client, 'cart_create', 'cart_create', {});
    const cartId = created.structuredContent.cart_id;
    transcript.cartId = cartId;
    await call(client, 'cart_set_item', 'cart_set_item', { cart_id: cartId, sku: product.sku, quantity: 1 });
    if (transcript.tools.includes('cart_checkout')) {
      await call(client, 'cart_checkout', 'cart_checkout', { cart_id: cartId });
    }
    await call(client, 'cart_view', 'cart_view', { cart_id: cartId });
  } finally {
    await client.close();
  }
}

try {
  await scenarios[scenario]();
} catch (error) {
  transcript.error = { name: error?.name, message: String(error?.message ?? error), code: error?.code };
}
process.stdout.write(JSON.stringify(transcript) + '\n');
