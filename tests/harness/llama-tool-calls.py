#!/usr/bin/env python3
"""Counts how many of N tool requests to a running llama-server come back as parsed tool calls.

Sends N requests that offer a `read_file(path)` tool to /v1/chat/completions, /v1/responses or
/v1/messages (stream or not), reads the calls back from the reply (for a stream, by
concatenating the argument deltas) and prints one JSON line: how many replies had 1, 2, ...
calls whose name is `read_file` and whose arguments are a JSON object, how many had none, an
invalid call, an HTTP error or an error event. Request i uses prompt i (10 files x 4
phrasings) and, where the API takes one, `seed: i`, so a rerun is comparable.

  python3 tests/harness/llama-tool-calls.py http://127.0.0.1:PORT chat 20 [--stream]
      [--choice required|auto|none] [--parallel true|false|omit] [--max-len 64|0]
      [--max-tokens 64] [--two-files] [--after-result] [--prefill TEXT] [--show]

--two-files asks for two files at once (for parallel calls); --after-result sends the user
turn, an assistant call and its result, so the reply is the turn after a tool result;
--prefill appends an assistant message the reply continues (chat only). Standard library only.
See docs/llama-tool-calls.md.
"""
import argparse
import json
import urllib.error
import urllib.request

FILES = ["src/main.rs", "README.md", "Cargo.toml", "docs/intro.md", "tests/a.rs", "/etc/hosts",
         "notes.txt", "lib/util.py", "config.yaml", "Makefile"]
PROMPTS = ["Read the file {f}.", "Show me what is in {f}.", "Open {f} and tell me what it says.",
           "What does {f} contain?"]
RESULTS = ["The meeting is on Tuesday at 10.", "Buy milk and eggs.", "Fix the login bug first.",
           "cairn is an agent.", "Ship version 2 in May."]
DESC = "Read a text file and return its contents."
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def schema(a):
    path = {"type": "string"}
    if a.max_len:
        path["maxLength"] = a.max_len
    return {"type": "object", "properties": {"path": path}, "required": ["path"]}


def conversation(i, a):
    """The turns as (role, text) / ("call", path) / ("result", text)."""
    f = FILES[i % len(FILES)]
    if a.two_files:
        return [("user", f"Read the files {f} and {FILES[(i + 3) % len(FILES)]}.")]
    if a.after_result:
        return [("user", f"Read the file {f} and tell me what it says."), ("call", f),
                ("result", RESULTS[i % len(RESULTS)])]
    return [("user", PROMPTS[i % len(PROMPTS)].format(f=f))]


def body_for(kind, i, a):
    turns = conversation(i, a)
    if kind == "chat":
        msgs = []
        for role, x in turns:
            if role == "user":
                msgs.append({"role": "user", "content": x})
            elif role == "call":
                msgs.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": x})}}]})
            else:
                msgs.append({"role": "tool", "tool_call_id": "call_1", "content": x})
        if a.prefill is not None:
            msgs.append({"role": "assistant", "content": a.prefill})
        b = {"messages": msgs, "max_tokens": a.max_tokens, "seed": i, "tool_choice": a.choice,
             "tools": [{"type": "function",
                        "function": {"name": "read_file", "description": DESC, "parameters": schema(a)}}]}
    elif kind == "responses":
        items = []
        for role, x in turns:
            if role == "user":
                items.append({"role": "user", "content": x})
            elif role == "call":
                items.append({"type": "function_call", "call_id": "call_1", "name": "read_file",
                              "arguments": json.dumps({"path": x})})
            else:
                items.append({"type": "function_call_output", "call_id": "call_1", "output": x})
        b = {"input": items, "max_output_tokens": a.max_tokens, "seed": i, "tool_choice": a.choice,
             "tools": [{"type": "function", "name": "read_file", "description": DESC,
                        "parameters": schema(a)}]}
    else:
        msgs = []
        for role, x in turns:
            if role == "user":
                msgs.append({"role": "user", "content": x})
            elif role == "call":
                msgs.append({"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": x}}]})
            else:
                msgs.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": x}]})
        b = {"model": "smollm2", "max_tokens": a.max_tokens, "messages": msgs,
             "tools": [{"name": "read_file", "description": DESC, "input_schema": schema(a)}],
             "tool_choice": {"type": {"required": "any", "auto": "auto", "none": "none"}[a.choice]}}
    # /v1/messages has no such field (llama.cpp ignores `disable_parallel_tool_use`).
    if a.parallel != "omit" and kind != "messages":
        b["parallel_tool_calls"] = a.parallel == "true"
    if a.stream:
        b["stream"] = True
    return b


def sse(resp):
    """[(event, data)] of a server-sent event stream."""
    event, out = None, []
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            out.append((event, json.loads(line[6:])))
    return out


class StreamError(Exception):
    pass


def read_reply(kind, stream, r):
    """([(name, arguments as a string)], text, number of argument deltas, stop reason)."""
    if not stream:
        if kind == "chat":
            c = r["choices"][0]
            m = c["message"]
            calls = [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or []]
            return calls, m.get("content") or "", None, c["finish_reason"]
        if kind == "responses":
            calls = [(o["name"], o["arguments"]) for o in r["output"] if o["type"] == "function_call"]
            text = "".join(p.get("text", "") for o in r["output"] if o["type"] == "message"
                           for p in o["content"])
            return calls, text, None, r["status"]
        calls = [(c["name"], json.dumps(c["input"])) for c in r["content"] if c["type"] == "tool_use"]
        text = "".join(c.get("text", "") for c in r["content"] if c["type"] == "text")
        return calls, text, None, r["stop_reason"]
    calls, text, deltas, stop = {}, "", 0, None
    for event, d in r:
        if "error" in d or event == "error":
            raise StreamError(json.dumps(d)[:200])
        if kind == "chat":
            for ch in d.get("choices", []):
                delta = ch.get("delta") or {}
                text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    e = calls.setdefault(tc["index"], ["", ""])
                    f = tc.get("function", {})
                    e[0] += f.get("name") or ""
                    if f.get("arguments"):
                        e[1] += f["arguments"]
                        deltas += 1
                stop = ch.get("finish_reason") or stop
        elif kind == "responses":
            t = d.get("type")
            if t == "response.output_item.added" and d["item"]["type"] == "function_call":
                calls[d["item"]["id"]] = [d["item"]["name"], ""]
            elif t == "response.function_call_arguments.delta":
                calls[d["item_id"]][1] += d["delta"]
                deltas += 1
            elif t == "response.output_text.delta":
                text += d["delta"]
            elif t == "response.completed":
                stop = d["response"]["status"]
        else:
            t = d.get("type")
            if t == "content_block_start" and d["content_block"]["type"] == "tool_use":
                calls[d["index"]] = [d["content_block"]["name"], ""]
            elif t == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
                calls[d["index"]][1] += d["delta"]["partial_json"]
                deltas += 1
            elif t == "content_block_delta" and d["delta"]["type"] == "text_delta":
                text += d["delta"]["text"]
            elif t == "message_delta":
                stop = d["delta"].get("stop_reason")
    return [tuple(v) for v in calls.values()], text, deltas, stop


def valid(call):
    try:
        return call[0] == "read_file" and isinstance(json.loads(call[1]), dict)
    except ValueError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("kind", choices=sorted(PATHS))
    ap.add_argument("n", type=int)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--choice", default="required", choices=["required", "auto", "none"])
    ap.add_argument("--parallel", default="false", choices=["true", "false", "omit"])
    ap.add_argument("--max-len", type=int, default=64, help="maxLength of the path parameter; 0: none")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--two-files", action="store_true")
    ap.add_argument("--after-result", action="store_true")
    ap.add_argument("--prefill", default=None)
    ap.add_argument("--show", action="store_true", help="print every reply")
    a = ap.parse_args()
    tally = {}
    for i in range(a.n):
        req = urllib.request.Request(a.url.rstrip("/") + PATHS[a.kind],
                                     data=json.dumps(body_for(a.kind, i, a)).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                r = sse(resp) if a.stream else json.load(resp)
            calls, text, deltas, stop = read_reply(a.kind, a.stream, r)
        except urllib.error.HTTPError as e:
            key = f"HTTP {e.code}"
            detail = e.read()[:160]
        except StreamError as e:
            key, detail = "error event", str(e)
        else:
            if not calls:
                key = "text" if text.strip() else "empty"
            elif all(valid(c) for c in calls):
                key = f"{len(calls)} parsed call" + ("s" if len(calls) > 1 else "")
            else:
                key = "invalid call"
            detail = f"stop={stop} argument_deltas={deltas} calls={calls} text={text[:120]!r}"
        tally[key] = tally.get(key, 0) + 1
        if a.show:
            print(i, key, detail)
    print(json.dumps({"endpoint": PATHS[a.kind], "stream": a.stream, "tool_choice": a.choice,
                      "parallel_tool_calls": "n/a" if a.kind == "messages" else a.parallel, "max_len": a.max_len, "n": a.n,
                      "two_files": a.two_files, "after_result": a.after_result,
                      "prefill": a.prefill, "outcomes": tally}))


if __name__ == "__main__":
    main()
