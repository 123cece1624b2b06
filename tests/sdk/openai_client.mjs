// openai_client.mjs - the official OpenAI Node client (npm `openai`) against a running tide.
// Usage: node openai_client.mjs BASE_URL API_KEY   (tests/sdk/run.sh starts the daemon).
// Prints one "ok ..." line per check and exits 1 on the first failure.
import OpenAI from "openai";
import zlib from "node:zlib";
import assert from "node:assert/strict";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey, maxRetries: 0, timeout: 120000 });
const ok = (m) => console.log("ok " + m);

// A w x h RGB PNG of one colour, written by hand so the test needs no image package.
function png(w, h, [r, g, b]) {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (buf) => {
    let c = 0xffffffff;
    for (const x of buf) c = crcTable[(c ^ x) & 255] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type), data]);
    const c = Buffer.alloc(4); c.writeUInt32BE(crc(td));
    return Buffer.concat([len, td, c]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; ihdr[9] = 2; // 8-bit RGB
  const raw = Buffer.alloc((w * 3 + 1) * h);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++) raw.set([r, g, b], y * (w * 3 + 1) + 1 + x * 3);
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", ihdr),
                        chunk("IDAT", zlib.deflateSync(raw)), chunk("IEND", Buffer.alloc(0))]);
}

const models = await client.models.list();
assert.ok(models.data.length >= 1 && typeof models.data[0].id === "string", "models.list is empty");
const model = models.data[0].id;
ok(`models.list: ${models.data.map((m) => m.id).join(", ")}`);

const messages = [{ role: "user", content: "Hello! What colour is the sky?" }];
const plain = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 16 });
const text = plain.choices[0].message.content;
assert.equal(plain.object, "chat.completion");
assert.equal(typeof text, "string");
assert.ok(text.length > 0, "empty completion");
assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
assert.ok(plain.usage.prompt_tokens > 0 && plain.usage.completion_tokens > 0);
assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
ok(`chat plain: ${JSON.stringify(text)} (${plain.usage.completion_tokens} tokens)`);

const stream = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 16,
  stream: true, stream_options: { include_usage: true } });
let streamed = "", chunks = 0, usage = null, finish = null;
for await (const c of stream) {
  assert.equal(c.object, "chat.completion.chunk");
  if (c.usage) usage = c.usage;
  for (const ch of c.choices) {
    streamed += ch.delta?.content ?? "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  chunks++;
}
assert.equal(streamed, text, "streamed text differs from the plain reply at temperature 0");
assert.equal(finish, plain.choices[0].finish_reason);
assert.ok(usage && usage.completion_tokens === plain.usage.completion_tokens, "no usage chunk");
ok(`chat stream: ${chunks} chunks, same text and usage as plain`);

const comp = await client.completions.create({ model, prompt: "The red square and the blue circle are",
  max_tokens: 8, temperature: 0 });
assert.equal(comp.object, "text_completion");
assert.ok(comp.choices[0].text.length > 0);
ok(`completions: ${JSON.stringify(comp.choices[0].text)}`);

try {
  await client.chat.completions.create({ model, messages, temperature: 7 });
  assert.fail("temperature 7 was accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${e}`);
  assert.equal(e.status, 400);
  assert.equal(e.param, "temperature");
  ok(`bad temperature: BadRequestError 400, param ${e.param}: ${e.message}`);
}

const wrong = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "not-the-key", maxRetries: 0 });
try {
  await wrong.models.list();
  assert.fail("a wrong API key was accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.AuthenticationError, `expected AuthenticationError, got ${e}`);
  ok("wrong key: AuthenticationError 401");
}

const url = "data:image/png;base64," + png(32, 32, [220, 30, 30]).toString("base64");
const img = await client.chat.completions.create({ model, temperature: 0, max_tokens: 12, messages: [
  { role: "user", content: [{ type: "text", text: "What is in this image?" },
                            { type: "image_url", image_url: { url } }] }] });
assert.ok(img.usage.prompt_tokens > plain.usage.prompt_tokens, "the image added no prompt tokens");
assert.equal(typeof img.choices[0].message.content, "string");
ok(`image: ${JSON.stringify(img.choices[0].message.content)} (${img.usage.prompt_tokens} prompt tokens)`);

// A client that walks away mid-stream: the daemon cancels the job and serves the next request.
const ac = new AbortController();
const long = await client.chat.completions.create({ model, messages, max_tokens: 200, stream: true },
                                                  { signal: ac.signal });
let got = 0;
try {
  for await (const c of long) { if (++got === 3) ac.abort(); }
} catch (e) {
  assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", `abort: ${e}`);
}
const after = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 16 });
assert.equal(after.choices[0].message.content, text, "the reply after an aborted stream changed");
ok("aborted stream: next request answered, same text");

// Structured outputs: chat.completions.parse with a strict JSON schema (response_format
// json_schema) returns message.parsed, an object that validates against the schema.
const shapeSchema = {
  type: "object", additionalProperties: false, required: ["shape", "count", "filled", "colour"],
  properties: {
    shape: { enum: ["square", "circle", "triangle"] }, count: { type: "integer" }, filled: { type: "boolean" },
    colour: { anyOf: [{ type: "null" }, { $ref: "#/$defs/colour" }] },
  },
  $defs: { colour: { type: "string", enum: ["red", "blue", "green"] } },
};
for (const temperature of [0, 1]) {
  const r = await client.chat.completions.parse({ model, temperature, seed: 7, max_tokens: 200,
    messages: [{ role: "user", content: "Describe a red square as JSON." }],
    response_format: { type: "json_schema", json_schema: { name: "shape", strict: true, schema: shapeSchema } } });
  const p = r.choices[0].message.parsed;
  assert.equal(r.choices[0].finish_reason, "stop", `cut short: ${r.choices[0].message.content}`);
  assert.ok(p && typeof p === "object", "no parsed object");
  assert.deepEqual(Object.keys(p), ["shape", "count", "filled", "colour"]);
  assert.ok(["square", "circle", "triangle"].includes(p.shape), `shape ${p.shape}`);
  assert.ok(Number.isInteger(p.count), `count ${p.count}`);
  assert.equal(typeof p.filled, "boolean");
  assert.ok(p.colour === null || ["red", "blue", "green"].includes(p.colour), `colour ${p.colour}`);
  ok(`chat.completions.parse (temperature ${temperature}): ${JSON.stringify(p)}`);
}
try {
  await client.chat.completions.create({ model, messages, response_format: { type: "json_schema",
    json_schema: { name: "x", schema: { type: "string", pattern: "^a" } } } });
  assert.fail("a schema with pattern was accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError && e.param === "response_format" && /pattern/.test(e.message), `${e}`);
  ok(`json_schema outside the subset: 400, param response_format: ${e.message}`);
}

// logit_bias -100 on the token greedy decoding picks first: the reply starts otherwise.
const first = await client.completions.create({ model, prompt: "The red square and the blue circle are",
  max_tokens: 1, temperature: 0 });
const tok = await (await fetch(baseURL + "/tokenize", { method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ content: first.choices[0].text }) })).json();
assert.equal(tok.tokens.length, 1, `greedy's first token ${JSON.stringify(first.choices[0].text)} re-tokenizes to ${tok.tokens}`);
const banned = await client.completions.create({ model, prompt: "The red square and the blue circle are",
  max_tokens: 1, temperature: 0, logit_bias: { [tok.tokens[0]]: -100 } });
assert.notEqual(banned.choices[0].text, first.choices[0].text, "logit_bias -100 did not remove the token");
ok(`logit_bias: token ${tok.tokens[0]} ${JSON.stringify(first.choices[0].text)} banned, got ${JSON.stringify(banned.choices[0].text)}`);

// Tool calls: tool_choice "required" and a named function are enforced by constrained decoding,
// so even the tiny random model answers with a valid call, plain and streamed; the call and the
// tool's result then go back as the next turn.
const countTool = { type: "function", function: { name: "get_shape_count", description: "Count the shapes of a colour",
  strict: true, parameters: { type: "object", additionalProperties: false, required: ["colour"],
    properties: { colour: { type: "string", enum: ["red", "green", "blue"] } } } } };
const sidesTool = { type: "function", function: { name: "sides", strict: true,
  parameters: { type: "object", additionalProperties: false, required: ["shape", "filled"],
    properties: { shape: { enum: ["square", "triangle"] }, filled: { type: "boolean" } } } } };
const tools = [countTool, sidesTool];
const toolMessages = [{ role: "user", content: "How many red shapes are there?" }];
const validCall = (c, where) => {
  assert.equal(c.type, "function", where);
  assert.match(c.id, /^call_/, where);
  const a = JSON.parse(c.function.arguments);
  if (c.function.name === "get_shape_count") {
    assert.deepEqual(Object.keys(a), ["colour"], where);
    assert.ok(["red", "green", "blue"].includes(a.colour), `${where}: colour ${a.colour}`);
  } else {
    assert.equal(c.function.name, "sides", where);
    assert.deepEqual(Object.keys(a), ["shape", "filled"], where);
    assert.ok(["square", "triangle"].includes(a.shape) && typeof a.filled === "boolean", `${where}: ${c.function.arguments}`);
  }
  return a;
};
const req = await client.chat.completions.create({ model, messages: toolMessages, tools, tool_choice: "required",
  temperature: 0, max_tokens: 400 });
assert.equal(req.choices[0].finish_reason, "tool_calls");
assert.equal(req.choices[0].message.content, null);
assert.equal(req.choices[0].message.tool_calls.length, 1);
validCall(req.choices[0].message.tool_calls[0], "required");
ok(`tool_choice required: ${JSON.stringify(req.choices[0].message.tool_calls[0].function)}`);

const named = { type: "function", function: { name: "sides" } };
const st = await client.chat.completions.create({ model, messages: toolMessages, tools, tool_choice: named,
  temperature: 0, max_tokens: 400, stream: true });
const acc = [];
let stFinish = null;
for await (const c of st) {
  for (const ch of c.choices) {
    assert.ok(!ch.delta?.content, `content in a forced call's stream: ${JSON.stringify(ch.delta)}`);
    for (const d of ch.delta?.tool_calls ?? []) {
      acc[d.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
      if (d.id) acc[d.index].id = d.id;
      acc[d.index].function.name += d.function?.name ?? "";
      acc[d.index].function.arguments += d.function?.arguments ?? "";
    }
    if (ch.finish_reason) stFinish = ch.finish_reason;
  }
}
assert.equal(stFinish, "tool_calls");
assert.equal(acc.length, 1);
assert.equal(acc[0].function.name, "sides");
validCall(acc[0], "named, streamed");
ok(`tool_choice named, streamed: ${JSON.stringify(acc[0].function)}`);

// strict tools: the client's parse() turns the arguments into parsed_arguments itself
const parsed = await client.chat.completions.parse({ model, messages: toolMessages, tools, temperature: 1, seed: 5,
  tool_choice: { type: "function", function: { name: "get_shape_count" } }, max_tokens: 400 });
const pc = parsed.choices[0].message.tool_calls[0];
assert.deepEqual(pc.function.parsed_arguments, validCall(pc, "parse"));
ok(`chat.completions.parse with a strict tool: parsed_arguments ${JSON.stringify(pc.function.parsed_arguments)}`);

const call = req.choices[0].message.tool_calls[0];
const trip = await client.chat.completions.create({ model, tools, temperature: 0, max_tokens: 8, messages: [
  ...toolMessages, req.choices[0].message, { role: "tool", tool_call_id: call.id, content: "3" }] });
assert.ok(trip.usage.prompt_tokens > req.usage.prompt_tokens, "the call and its result did not reach the prompt");
assert.ok(typeof trip.choices[0].message.content === "string" || trip.choices[0].message.tool_calls);
ok(`tool result round trip: ${trip.usage.prompt_tokens} prompt tokens, finish ${trip.choices[0].finish_reason}`);

try {
  await client.chat.completions.create({ model, messages: toolMessages, tools,
    tool_choice: { type: "function", function: { name: "missing" } } });
  assert.fail("a tool_choice naming no tool was accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError && e.param === "tool_choice", `${e}`);
  ok(`tool_choice naming no tool: 400, param tool_choice: ${e.message}`);
}
