// An agent in JavaScript (Node >= 18, no packages): a calculator tool loop on the OpenAI chat API,
// trained as it is. The Controller runs it as a command (`agentlightning.local.command:
// [node, agent.mjs]`) with the agent contract's environment: the rollout's OpenAI base URL and
// key, the event URL for the reward, and the task's fields (QUESTION, ANSWER by `env_map`).
// Nothing here knows about training: it calls a model, uses its tool, and reports a reward.

const { AGL_OPENAI_BASE_URL, AGL_KEY, AGL_EVENT_URL, QUESTION, ANSWER } = process.env;
const MAX_TURNS = 4;

const TOOLS = [
  {
    type: "function",
    function: {
      name: "calculate",
      description: "Evaluate an arithmetic expression with + - * / and parentheses.",
      parameters: {
        type: "object",
        properties: { expression: { type: "string" } },
        required: ["expression"],
      },
    },
  },
];

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${AGL_KEY}` },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`${url} answered ${response.status}: ${await response.text()}`);
  return response.json();
}

function calculate(expression) {
  if (!/^[\d\s+\-*/().]+$/.test(expression)) return `not an arithmetic expression: ${expression}`;
  return String(Function(`"use strict"; return (${expression});`)());
}

async function solve(question) {
  const messages = [
    { role: "system", content: "Use the calculator, then answer with the number alone." },
    { role: "user", content: question },
  ];
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    const completion = await post(`${AGL_OPENAI_BASE_URL}/chat/completions`, {
      model: "policy",
      messages,
      tools: TOOLS,
      max_tokens: 256,
    });
    const message = completion.choices[0].message;
    messages.push(message); // sent back as the API returned it: the Gateway merges the turns
    if (!message.tool_calls?.length) return message.content ?? "";
    for (const call of message.tool_calls) {
      const { expression } = JSON.parse(call.function.arguments);
      messages.push({ role: "tool", tool_call_id: call.id, content: calculate(expression) });
    }
  }
  return "";
}

const answer = await solve(QUESTION);
const numbers = answer.match(/-?\d+(\.\d+)?/g) ?? [];
const reward = numbers.length && Number(numbers.at(-1)) === Number(ANSWER) ? 1.0 : 0.0;
await post(AGL_EVENT_URL, { event_type: "reward", data: { value: reward } });
console.log(`answer ${JSON.stringify(answer)}, expected ${ANSWER}: reward ${reward}`);
