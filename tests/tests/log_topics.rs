//! Log topics: recompiles and guards are logged under their `tracing` targets.
//!
//! Alone in its test binary: `tracing` caches each call site's interest globally, and a test
//! thread hitting the same call sites without a subscriber at the same moment can leave this
//! test's scoped subscriber without events (it failed that way beside the other dynamo tests).

use minductor::{jit, Backend, Traced};
use minductor_tests::ramp_from_one;
use std::sync::{Arc, Mutex};

fn mlp_like(x: &[Traced]) -> Vec<Traced> {
    vec![(&x[0] * 2.0 + 1.0).gelu().softmax(-1)]
}

/// Events captured from the `tracing` crate: (target, level, message).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(String, tracing::Level, String)>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let meta = event.metadata();
        self.0
            .lock()
            .unwrap()
            .push((meta.target().to_string(), *meta.level(), message.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn recompiles_guards_and_the_limit_warning_are_logged_under_their_topics() {
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let f = jit(mlp_like)
            .backend(Backend::Eager)
            .dynamic(Some(false))
            .recompile_limit(2)
            .input_names(&["x"])
            .name("mlp_like");
        for batch in [256, 128, 64, 32] {
            f.call(&[ramp_from_one(&[batch, 4], 0.0)]).unwrap();
        }
    });
    let events = capture.0.lock().unwrap();
    let with = |target: &str, level: tracing::Level| -> Vec<String> {
        events
            .iter()
            .filter(|(t, l, _)| t == target && *l == level)
            .map(|(_, _, m)| m.clone())
            .collect()
    };
    assert_eq!(
        with("minductor::recompiles", tracing::Level::INFO),
        vec!["Recompiling mlp_like: input x, dim 0: expected 256, got 128"]
    );
    let warnings = with("minductor::recompiles", tracing::Level::WARN);
    assert_eq!(
        warnings.len(),
        1,
        "warned once for two eager calls: {warnings:?}"
    );
    assert!(warnings[0].contains("recompile limit (2) reached"));
    assert!(with("minductor::guards", tracing::Level::INFO)
        .iter()
        .any(|m| m == "mlp_like: guard input x: dtype f32, shape [256, 4], contiguous"));
    assert!(!with("minductor::guards", tracing::Level::DEBUG).is_empty());
}
