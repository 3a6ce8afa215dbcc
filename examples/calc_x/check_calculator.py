"""Check that the MCP calculator starts and answers over stdio, as the agent uses it.

    python check_calculator.py        (exit 0 and prints the tools when it works)

Run at image build time (Dockerfile) and by the tests: a broken calculator install fails
there, not in the middle of training.
"""

from __future__ import annotations

import asyncio
import sys

from autogen_ext.tools.mcp import McpWorkbench
from calc_agent import CALCULATOR


async def check() -> None:
    async with McpWorkbench(server_params=CALCULATOR) as workbench:
        names = [tool["name"] for tool in await workbench.list_tools()]
        if "calculate" not in names:
            raise SystemExit(f"the MCP calculator offers {names}, not 'calculate'")
        result = await workbench.call_tool("calculate", {"expression": "(6.6 - 5.6) / (3/2)"})
        text = result.to_text()
        if result.is_error or not text.startswith("0.666"):
            raise SystemExit(f"the MCP calculator answered {text!r} to (6.6 - 5.6) / (3/2)")
    print(f"MCP calculator ok: tools {names}, (6.6 - 5.6) / (3/2) = {text}")


if __name__ == "__main__":
    asyncio.run(check())
    sys.exit(0)
