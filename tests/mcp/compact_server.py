"""An MCP server written with the official Python MCP SDK (`mcp` on PyPI) that exposes the
`context_compact(segment, budget_chars, instruction)` tool `engine: mcp` calls, and `whoami`
(the Authorization header the request carried), over streamable HTTP on 127.0.0.1.

The summary is deterministic: the nine numbered sections the agent's quality gate and its
summary layout expect, each followed by a slice of the segment, within budget_chars.

    python compact_server.py PORT [--mode ok|error|empty|slow] [--log FILE]

--mode error answers an isError result, empty an empty text, slow sleeps 30 s first.
--log appends one JSON line per call (tool, budget_chars, segment length, authorization).
"""

import argparse
import json
import time

from mcp.server.mcpserver import Context, MCPServer

SECTIONS = [
    "Primary request and intent",
    "Key technical concepts",
    "Files and code",
    "Errors and fixes",
    "Problem solving",
    "All user messages (verbatim)",
    "Pending tasks",
    "Current work",
    "Optional next step",
]
BANNER = "Summary written by cairn-test-compactor (context_compact)."

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("--mode", default="ok", choices=["ok", "error", "empty", "slow"])
parser.add_argument("--log")
args = parser.parse_args()

server = MCPServer("cairn-test-compactor")


def log(entry: dict) -> None:
    if args.log:
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def authorization(ctx: Context) -> str:
    headers = ctx.headers or {}
    return headers.get("authorization", "")


def summary(segment: str, budget_chars: int) -> str:
    layout = [BANNER] + [f"{n}. {s}" for n, s in enumerate(SECTIONS, 1)]
    fixed = sum(len(line) + 1 for line in layout) + len(SECTIONS)
    room = max(0, budget_chars - fixed)
    share = room // len(SECTIONS)
    out = [BANNER]
    for n, s in enumerate(SECTIONS, 1):
        part = segment[(n - 1) * share : n * share].replace("\n", " ")
        out.append(f"{n}. {s}\n{part}")
    return "\n".join(out)


@server.tool()
def context_compact(segment: str, budget_chars: int, instruction: str, ctx: Context) -> str:
    """Summarize a conversation segment within budget_chars characters."""
    log({
        "tool": "context_compact",
        "budget_chars": budget_chars,
        "segment_chars": len(segment),
        "instruction_chars": len(instruction),
        "authorization": authorization(ctx),
    })
    if args.mode == "error":
        raise ValueError("compactor is configured to fail")
    if args.mode == "empty":
        return ""
    if args.mode == "slow":
        time.sleep(30)
    return summary(segment, budget_chars)


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header this request carried."""
    auth = authorization(ctx)
    log({"tool": "whoami", "authorization": auth})
    return auth or "(no authorization header)"


server.run("streamable-http", host="127.0.0.1", port=args.port)
