//! `MINDUCTOR_LOGS` topics select `tracing` events, `+topic` adds the DEBUG ones.
//!
//! Its own test binary with one test: `tracing` caches each callsite's interest process-wide,
//! computed on the thread that first reaches it, so a sibling test compiling without a
//! subscriber could disable the callsites this test captures.

use minductor_frontend::logging::LogSpec;
use minductor_frontend::{compile_with, trace, Backend};
use minductor_ir::DType;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Compiles softmax with a subscriber filtering on `spec` and returns what it printed.
fn logs_of(spec: &str) -> String {
    let graph = trace(|t| vec![t.input("x", DType::F32, &[4, 8]).softmax(-1)]).unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            LogSpec::parse(spec).directives(),
        ))
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        compile_with(&graph, Backend::Inductor).unwrap();
    });
    let bytes = captured.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn topics_select_events_and_plus_adds_detail() {
    let logs = logs_of("graph,fusion");
    assert!(logs.contains("minductor::graph"), "{logs}");
    assert!(
        logs.contains("input[x] : f32[4, 8]"),
        "captured graph text: {logs}"
    );
    assert!(logs.contains("1 kernels, 0 extern matmuls"), "{logs}");
    assert!(
        logs.contains("k0_div_exp_sub_reduce_max_reduce_sum  kernel"),
        "{logs}"
    );
    assert!(
        !logs.contains("load buf0"),
        "kernel IR is DEBUG detail: {logs}"
    );
    assert!(!logs.contains("minductor::aot"), "{logs}");
    assert!(!logs.contains("minductor::output_code"), "{logs}");

    let logs = logs_of("+fusion,aot,output_code,schedule");
    assert!(!logs.contains("minductor::graph"), "{logs}");
    assert!(
        logs.contains("load buf0[8*o0 + i0]"),
        "+fusion shows the kernel IR: {logs}"
    );
    assert!(
        logs.contains("reduce_max[axes=[1], keepdim=true]"),
        "aot: {logs}"
    );
    assert!(
        logs.contains("function u0:0"),
        "output_code shows Cranelift IR: {logs}"
    );
    assert!(
        logs.contains(
            "step 0: kernel k0_div_exp_sub_reduce_max_reduce_sum reads buf0, buf1 writes buf1"
        ),
        "{logs}"
    );
}
