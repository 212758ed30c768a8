//! The history the agent benchmarks run on.

use cairn_agent::history::{Message, ToolCall};

/// A coding-session-like history of about `bytes`: prompts, tool calls with results of a
/// few KB, assistant prose. The results stay under the default `minContentChars`, so
/// microcompaction leaves them whole and every turn really carries `bytes` of history.
pub fn history(bytes: usize) -> Vec<Message> {
    let mut h = vec![Message::system("You are a coding agent.")];
    let mut size = 0;
    let mut i = 0;
    while size < bytes {
        let result: String = (0..48)
            .map(|l| format!("src/module_{i}.rs:{l}: let value_{l} = compute({l}, {i});\n"))
            .collect();
        let msgs = [
            Message::user(format!("step {i}: look at module {i} and fix the warning")),
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: format!("c{i}"),
                    name: "read_file".into(),
                    arguments: format!("{{\"path\":\"src/module_{i}.rs\",\"offset\":{i}}}"),
                }],
            ),
            Message::tool(format!("c{i}"), result),
            Message::assistant(format!(
                "Module {i} computes values in a loop; the warning is an unused binding. {}",
                "Details follow. ".repeat(20)
            )),
        ];
        for m in msgs {
            size += m.weight();
            h.push(m);
        }
        i += 1;
    }
    h
}
