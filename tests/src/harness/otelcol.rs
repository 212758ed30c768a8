//! A real OpenTelemetry Collector (built from its Go modules by
//! `tests/harness/build-otelcol.sh`): the OTLP receiver over HTTP on loopback and the debug
//! exporter, which writes every span it receives, with its attributes, to the collector's
//! log. [`Collector::spans`] reads them back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::HarnessError;
use super::proc::{Proc, free_port, wait_until};

pub struct Collector {
    /// The OTLP/HTTP receiver: an exporter's endpoint is `http://{addr}` (it appends
    /// `/v1/traces`).
    pub addr: SocketAddr,
    log: PathBuf,
    proc: Proc,
}

/// One span as the collector received it.
#[derive(Clone, Debug, Default)]
pub struct Span {
    pub name: String,
    /// The span's attributes with the collector's rendering of their values: `Str(chat)`,
    /// `Int(12)`, `Slice(["stop"])`.
    pub attributes: BTreeMap<String, String>,
    /// The attributes of the resource that sent it (`service.name`, `k8s.pod.name`).
    pub resource: BTreeMap<String, String>,
}

impl Span {
    /// An attribute's value without its type: `chat` for `Str(chat)`.
    pub fn value(&self, key: &str) -> Option<&str> {
        let v = self.attributes.get(key)?;
        let inner = v.split_once('(').map(|(_, rest)| rest).unwrap_or(v);
        Some(inner.strip_suffix(')').unwrap_or(inner))
    }
}

impl Collector {
    pub fn start(dir: &Path) -> Result<Self, HarnessError> {
        let bin = super::built_paths("build-otelcol.sh")?.get("otelcol")?;
        let dir = dir.join("otelcol");
        std::fs::create_dir_all(&dir)
            .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        let port = free_port()?;
        let config = dir.join("config.yaml");
        // No internal telemetry: it would bind fixed ports beside other tests' collectors.
        let text = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  debug:\n    verbosity: detailed\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n\
             \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [debug]\n"
        );
        std::fs::write(&config, text)
            .map_err(|e| HarnessError::io(format!("writing {}", config.display()), e))?;
        let log = dir.join("otelcol.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(&config);
        let mut proc = Proc::spawn("otelcol", cmd, &log)?;
        wait_until(
            "the OpenTelemetry Collector to start",
            Duration::from_secs(30),
            &mut [&mut proc],
            || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Everything is ready")),
        )?;
        Ok(Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
            proc,
        })
    }

    /// Every span received so far.
    pub fn spans(&mut self) -> Result<Vec<Span>, HarnessError> {
        self.proc.check_alive()?;
        let text = std::fs::read_to_string(&self.log)
            .map_err(|e| HarnessError::io(format!("reading {}", self.log.display()), e))?;
        Ok(parse_debug_output(&text))
    }
}

/// The spans in the debug exporter's detailed output: `Resource attributes:` and `Span #n`
/// blocks, each followed by `-> key: Type(value)` lines.
fn parse_debug_output(text: &str) -> Vec<Span> {
    #[derive(PartialEq)]
    enum In {
        Nothing,
        Resource,
        Span,
    }
    let mut spans: Vec<Span> = Vec::new();
    let mut resource = BTreeMap::new();
    let mut at = In::Nothing;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("ResourceSpans #") {
            resource = BTreeMap::new();
            at = In::Nothing;
        } else if trimmed == "Resource attributes:" {
            at = In::Resource;
        } else if trimmed.starts_with("Span #") {
            spans.push(Span {
                resource: resource.clone(),
                ..Span::default()
            });
            at = In::Span;
        } else if let Some(name) = trimmed.strip_prefix("Name           :") {
            if at == In::Span
                && let Some(s) = spans.last_mut()
            {
                s.name = name.trim().to_string();
            }
        } else if let Some(kv) = trimmed.strip_prefix("-> ") {
            let Some((k, v)) = kv.split_once(": ") else {
                continue;
            };
            match at {
                In::Resource => {
                    resource.insert(k.to_string(), v.to_string());
                }
                In::Span => {
                    if let Some(s) = spans.last_mut() {
                        s.attributes.insert(k.to_string(), v.to_string());
                    }
                }
                In::Nothing => {}
            }
        } else if trimmed.starts_with("Events:")
            || trimmed.starts_with("Links:")
            || trimmed.contains("\tinfo\t")
        {
            // A span's events and links, or the collector's own log line: not attributes.
            at = In::Nothing;
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_exporters_output_parses_into_spans() {
        let text = "2026-12-07T18:47:01.630Z\tinfo\tTraces\t{\"resource spans\": 1}\n\
ResourceSpans #0\nResource SchemaURL: \nResource attributes:\n     -> service.name: Str(cairn-agent)\n\
ScopeSpans #0\nScopeSpans SchemaURL: \nInstrumentationScope cairn-agent \nSpan #0\n\
    Trace ID       : 5b8aa5a2d2c872e8321cf37308d69df2\n    Parent ID      : \n\
    ID             : 051581bf3cb55c13\n    Name           : chat m-1\n    Kind           : Client\n\
Attributes:\n     -> gen_ai.operation.name: Str(chat)\n     -> gen_ai.usage.input_tokens: Int(12)\n\
Events:\nSpanEvent #0\n     -> Name: x\n     -> ignored: Str(event)\n\
Span #1\n    Name           : turn\nAttributes:\n     -> cairn.turn: Int(1)\n";
        let spans = parse_debug_output(text);
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].name, "chat m-1");
        assert_eq!(spans[0].value("gen_ai.operation.name"), Some("chat"));
        assert_eq!(spans[0].value("gen_ai.usage.input_tokens"), Some("12"));
        assert!(!spans[0].attributes.contains_key("ignored"));
        assert_eq!(
            spans[1].resource.get("service.name").map(String::as_str),
            Some("Str(cairn-agent)")
        );
        assert_eq!(spans[1].value("cairn.turn"), Some("1"));
    }
}
