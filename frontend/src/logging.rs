//! `MINDUCTOR_LOGS`: what `TORCH_LOGS` is to torch.compile, through the `tracing` ecosystem.
//!
//! minductor emits `tracing` events with targets `minductor::<topic>`: normal detail at INFO,
//! extra detail at DEBUG. `MINDUCTOR_LOGS` is a comma-separated list of topics; `topic` shows
//! the topic's INFO events, `+topic` its DEBUG events too, `all` (or `+all`) every topic:
//!
//! ```sh
//! MINDUCTOR_LOGS=graph,fusion,+output_code cargo run --release --example mlp_demo
//! ```
//!
//! The first `compile` installs a formatting subscriber writing to stderr, once per process,
//! when `MINDUCTOR_LOGS` is non-empty and no global subscriber is set yet; a program that
//! installs its own subscriber keeps it (filter on the `minductor::<topic>` targets there) and
//! can call [`init`] to get minductor's instead. Unknown topics produce one warning naming the
//! valid ones; they never fail or panic.

use std::sync::Once;
use tracing::Level;
use tracing_subscriber::EnvFilter;

/// The environment variable read by [`init`] and by the first compile.
pub const ENV_VAR: &str = "MINDUCTOR_LOGS";

/// Every topic, in the order the pipeline reaches them. Each is the target `minductor::<topic>`.
pub const TOPICS: &[&str] = &[
    "graph",
    "aot",
    "fusion",
    "schedule",
    "output_code",
    "guards",
    "recompiles",
    "dynamic",
    "graph_breaks",
    "perf",
];

/// A parsed `MINDUCTOR_LOGS` value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LogSpec {
    /// Each selected topic with its most detailed level (INFO for `topic`, DEBUG for `+topic`),
    /// in [`TOPICS`] order.
    pub topics: Vec<(&'static str, Level)>,
    /// Entries that name no topic, as written.
    pub unknown: Vec<String>,
}

impl LogSpec {
    /// Parses `graph,fusion,+output_code`: entries are trimmed, empty ones skipped, a repeated
    /// topic keeps its most detailed level. Never fails: unknown entries are collected.
    pub fn parse(spec: &str) -> LogSpec {
        let mut levels: Vec<Option<Level>> = vec![None; TOPICS.len()];
        let mut unknown = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, level) = match entry.strip_prefix('+') {
                Some(rest) => (rest.trim(), Level::DEBUG),
                None => (entry, Level::INFO),
            };
            let selected: Vec<usize> = if name == "all" {
                (0..TOPICS.len()).collect()
            } else {
                TOPICS.iter().position(|t| *t == name).into_iter().collect()
            };
            if selected.is_empty() {
                unknown.push(entry.to_string());
            }
            for i in selected {
                // `Level`'s order: DEBUG > INFO (more verbose is greater).
                levels[i] = Some(levels[i].map_or(level, |l| l.max(level)));
            }
        }
        LogSpec {
            topics: TOPICS
                .iter()
                .zip(levels)
                .filter_map(|(t, l)| Some((*t, l?)))
                .collect(),
            unknown,
        }
    }

    /// `EnvFilter` directives: minductor's warnings always, plus each topic at its level.
    pub fn directives(&self) -> String {
        let mut parts = vec!["minductor=warn".to_string()];
        for (topic, level) in &self.topics {
            let level = if *level == Level::DEBUG {
                "debug"
            } else {
                "info"
            };
            parts.push(format!("minductor::{topic}={level}"));
        }
        parts.join(",")
    }

    /// The warning for unknown entries, if any.
    pub fn unknown_warning(&self) -> Option<String> {
        if self.unknown.is_empty() {
            return None;
        }
        let names: Vec<String> = self.unknown.iter().map(|u| format!("`{u}`")).collect();
        Some(format!(
            "{ENV_VAR}: unknown topic{} {} ignored; valid topics: {}, all (prefix + for more detail)",
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            TOPICS.join(", ")
        ))
    }
}

/// Installs minductor's stderr subscriber for the topics in `$MINDUCTOR_LOGS` (all warnings of
/// minductor only, if it is unset). Returns false if a global subscriber was already set, in
/// which case that one stays and receives minductor's events.
pub fn init() -> bool {
    init_with(&std::env::var(ENV_VAR).unwrap_or_default())
}

/// [`init`] with an explicit topic list instead of the environment variable.
pub fn init_with(spec: &str) -> bool {
    let spec = LogSpec::parse(spec);
    let installed = match EnvFilter::try_new(spec.directives()) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init()
            .is_ok(),
        Err(e) => {
            eprintln!("minductor: cannot build the log filter for {ENV_VAR}: {e}");
            false
        }
    };
    if let Some(warning) = spec.unknown_warning() {
        warn(&warning);
    }
    installed
}

/// Called by every compile: the first call installs the subscriber if `MINDUCTOR_LOGS` is
/// non-empty and nobody installed one.
pub(crate) fn init_lazily() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let spec = std::env::var(ENV_VAR).unwrap_or_default();
        if !spec.trim().is_empty() && !tracing::dispatcher::has_been_set() {
            init_with(&spec);
        }
    });
}

/// A warning from minductor itself (target `minductor::logging`), printed to stderr directly
/// when no subscriber is installed so that it is never lost.
pub(crate) fn warn(message: &str) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "minductor::logging", "{message}");
    } else {
        eprintln!("minductor: warning: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_topics_are_info_and_plus_topics_debug() {
        let spec = LogSpec::parse("graph, fusion,+output_code");
        assert_eq!(
            spec.topics,
            vec![
                ("graph", Level::INFO),
                ("fusion", Level::INFO),
                ("output_code", Level::DEBUG)
            ]
        );
        assert!(spec.unknown.is_empty());
        assert_eq!(
            spec.directives(),
            "minductor=warn,minductor::graph=info,minductor::fusion=info,minductor::output_code=debug"
        );
        assert!(EnvFilter::try_new(spec.directives()).is_ok());
    }

    #[test]
    fn repeated_topics_keep_the_most_detail_and_all_selects_every_topic() {
        let spec = LogSpec::parse("+aot,aot,,");
        assert_eq!(spec.topics, vec![("aot", Level::DEBUG)]);
        let spec = LogSpec::parse("all,+schedule");
        assert_eq!(spec.topics.len(), TOPICS.len());
        assert!(spec.topics.contains(&("schedule", Level::DEBUG)));
        assert!(spec.topics.contains(&("guards", Level::INFO)));
        let spec = LogSpec::parse("+all");
        assert!(spec.topics.iter().all(|t| t.1 == Level::DEBUG));
    }

    #[test]
    fn unknown_topics_are_reported_with_the_valid_ones() {
        let spec = LogSpec::parse("graph,fusoin,+kernels");
        assert_eq!(spec.topics, vec![("graph", Level::INFO)]);
        assert_eq!(spec.unknown, vec!["fusoin", "+kernels"]);
        let warning = spec.unknown_warning().unwrap();
        assert!(warning.contains("`fusoin`, `+kernels`"), "{warning}");
        for topic in TOPICS {
            assert!(warning.contains(topic), "{warning}");
        }
        assert_eq!(LogSpec::parse("").unknown_warning(), None);
        assert_eq!(LogSpec::parse("").directives(), "minductor=warn");
    }
}
