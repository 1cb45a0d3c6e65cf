//! What the compiler did, for a person to read: the `MINDUCTOR_LOGS` events of every compile and
//! the `MINDUCTOR_DUMP_DIR` files (Inductor's `TORCH_COMPILE_DEBUG` directory, in small).
//!
//! Every compile gets a name, `graph_<n>_<hash>`: a process-wide counter and a hash of the
//! captured graph's text, so names are unique within a run and the same across runs of the same
//! program. With `MINDUCTOR_DUMP_DIR=DIR`, `DIR/<name>/` receives what the backend made:
//!
//! | file | contents | backends |
//! |---|---|---|
//! | `0_captured.txt` | the traced graph | all |
//! | `1_decompose.txt`, `2_simplify.txt` | the graph after each pass (for inductor, `2_simplify.txt` after `sink_cats` too: the graph `fuse` schedules) | aot_eager, inductor |
//! | `3_program.txt` | the kernel program code generation compiled: after every kernel-IR pass, with its buffer plan | inductor |
//! | `kernels.txt` | per step: kind, iteration domain, bytes read/written, FLOPs, fused nodes; each fallback step with its op and reason | inductor |
//! | `buffer_plan.txt` | every buffer: kind, dtype, shape, bytes, the steps it is live across | inductor |
//! | `output_code/<kernel>.clif` | each kernel's Cranelift IR as compiled | inductor |
//! | `graph.dot` | the prim graph in Graphviz, each kernel (and GEMM) a cluster | aot_eager, inductor |
//!
//! Writing never fails a compile: I/O errors are logged as warnings.
//!
//! Log events, by topic (INFO; `+topic` adds the DEBUG ones): `graph` the captured graph; `aot`
//! the prim graph (DEBUG: also the graph after `decompose` alone); `fusion` the kernel table
//! (DEBUG: the full kernel IR); `schedule` the step order with the buffers each step reads and
//! writes (DEBUG: the buffer plan); `output_code` each kernel's Cranelift IR; `perf` compile time.

use crate::compile::{Artifacts, Compiled};
use crate::logging;
use minductor_ir::{Graph, NodeId, Op};
use minductor_kernel_ir::cost::{program_cost, CostTable, StepKind};
use minductor_kernel_ir::{BufferId, BufferKind, Program, Step};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tracing::{debug, enabled, info, Level};

/// The environment variable naming the dump directory.
pub const ENV_VAR: &str = "MINDUCTOR_DUMP_DIR";

/// Called by `compile_with` once a backend has made its artifacts: logs them under their
/// topics and, if `MINDUCTOR_DUMP_DIR` is set, writes them there.
pub(crate) fn after_compile(
    graph: &Graph,
    backend: &str,
    artifacts: &Artifacts,
    compile_time: Duration,
) {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = graph_name(graph, COUNTER.fetch_add(1, Ordering::Relaxed));
    log_artifacts(&name, graph, backend, artifacts, compile_time);
    if let Some(dir) = std::env::var_os(ENV_VAR).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir).join(&name);
        write_files(&dir, graph, backend, artifacts, compile_time);
        info!(target: "minductor::graph", "{name}: dumped to {}", dir.display());
    }
}

/// Writes the dump of `compiled` into `dir` (the directory itself, not a parent) as
/// `MINDUCTOR_DUMP_DIR` would. Returns the files written; failures are logged as warnings.
pub fn dump_compiled(dir: &Path, compiled: &Compiled) -> Vec<PathBuf> {
    write_files(
        dir,
        compiled.graph(),
        compiled.backend().name(),
        compiled.artifacts(),
        compiled.compile_time(),
    )
}

/// `graph_<counter>_<8 hex digits of the FNV-1a hash of the graph's text>`.
fn graph_name(graph: &Graph, counter: usize) -> String {
    // The text is hashed as it is written, never held whole (a deep training step's text is
    // tens of megabytes: each `grad` node lists every parameter).
    let mut hash = crate::artifact::Fnv1a::new();
    std::fmt::Write::write_fmt(&mut hash, format_args!("{graph}"))
        .expect("hashing a graph's text does not fail");
    format!("graph_{counter:03}_{:08x}", hash.0 as u32)
}

fn log_artifacts(
    name: &str,
    graph: &Graph,
    backend: &str,
    artifacts: &Artifacts,
    compile_time: Duration,
) {
    info!(target: "minductor::graph", "{name}: captured graph ({backend})\n{graph}");
    if let Some(prims) = &artifacts.prim_graph {
        if let Some(decomposed) = &artifacts.decomposed {
            debug!(target: "minductor::aot", "{name}: after decompose\n{decomposed}");
        }
        if let Some(joint) = &artifacts.joint_graph {
            info!(target: "minductor::aot", "{name}: joint graph (forward and backward)\n{joint}");
        }
        if let Some(partition) = &artifacts.partition {
            info!(target: "minductor::aot", "{name}: {partition}{}", partition.graph_text());
        }
        info!(target: "minductor::aot", "{name}: prim graph after decompose and simplify\n{prims}");
    }
    if let (Some(prims), Some(program)) = (&artifacts.prim_graph, &artifacts.program) {
        if enabled!(target: "minductor::fusion", Level::INFO) {
            let kernels = program.kernels().count();
            let fallbacks = program.fallbacks().count();
            let matmuls = program.steps.len() - kernels - fallbacks;
            info!(
                target: "minductor::fusion",
                "{name}: {kernels} kernels, {matmuls} extern matmuls, {fallbacks} fallbacks\n{}",
                kernel_table(prims, program)
            );
        }
        debug!(target: "minductor::fusion", "{name}: kernel program\n{program}");
        if enabled!(target: "minductor::schedule", Level::INFO) {
            info!(target: "minductor::schedule", "{name}: schedule\n{}", schedule_text(program));
        }
        if enabled!(target: "minductor::schedule", Level::DEBUG) {
            debug!(target: "minductor::schedule", "{name}: buffer plan\n{}", buffer_plan(program));
        }
    }
    for (kernel, clif) in &artifacts.cranelift_ir {
        info!(target: "minductor::output_code", "{name}: {kernel}\n{clif}");
    }
    info!(
        target: "minductor::perf",
        "{name}: compiled with {backend} in {:.3} ms{}",
        compile_time.as_secs_f64() * 1e3,
        pass_times(artifacts)
    );
}

/// Each pass's time and sizes, one per line after a newline (empty without passes).
fn pass_times(artifacts: &Artifacts) -> String {
    artifacts
        .pass_times
        .iter()
        .map(|p| format!("\n  {p}"))
        .collect()
}

fn write_files(
    dir: &Path,
    graph: &Graph,
    backend: &str,
    artifacts: &Artifacts,
    compile_time: Duration,
) -> Vec<PathBuf> {
    let mut files: Vec<(PathBuf, String)> = vec![
        (
            dir.join("info.txt"),
            format!(
                "backend: {backend}\ncompile time: {:.3} ms\n",
                compile_time.as_secs_f64() * 1e3
            ),
        ),
        (
            dir.join("pass_times.txt"),
            artifacts
                .pass_times
                .iter()
                .map(|p| format!("{p}\n"))
                .collect(),
        ),
        (dir.join("0_captured.txt"), format!("{graph}\n")),
    ];
    if let Some(prims) = &artifacts.prim_graph {
        if let Some(decomposed) = &artifacts.decomposed {
            files.push((dir.join("1_decompose.txt"), format!("{decomposed}\n")));
        }
        files.push((dir.join("2_simplify.txt"), format!("{prims}\n")));
        if let Some(joint) = &artifacts.joint_graph {
            files.push((dir.join("1_joint.txt"), format!("{joint}\n")));
        }
        if let Some(partition) = &artifacts.partition {
            files.push((
                dir.join("2_partition.txt"),
                format!("{partition}\n{}", partition.graph_text()),
            ));
        }
        files.push((
            dir.join("graph.dot"),
            graph_dot(prims, artifacts.program.as_ref()),
        ));
        if let Some(program) = &artifacts.program {
            files.push((dir.join("3_program.txt"), program.to_string()));
            files.push((dir.join("kernels.txt"), kernel_table(prims, program)));
            files.push((dir.join("buffer_plan.txt"), buffer_plan(program)));
        }
    }
    for (kernel, clif) in &artifacts.cranelift_ir {
        let file: String = kernel
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        files.push((
            dir.join("output_code").join(format!("{file}.clif")),
            clif.clone(),
        ));
    }
    let mut written = Vec::new();
    for (path, text) in files {
        let result = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        match result {
            Ok(()) => written.push(path),
            Err(e) => logging::warn(&format!("{ENV_VAR}: cannot write {}: {e}", path.display())),
        }
    }
    written
}

/// The kernel list: per step its kind, iteration domain, bytes read and written and FLOPs
/// (`program_cost`), then the graph nodes each step fused, with their ops.
pub fn kernel_table(prims: &Graph, program: &Program) -> String {
    let costs = program_cost(program);
    let mut text = CostTable(&costs).to_string();
    text.push_str("\nfused graph nodes:\n");
    for cost in &costs {
        let nodes: Vec<String> = cost
            .nodes
            .iter()
            .map(|&n| match prims.nodes().get(n.index()) {
                Some(node) => format!("{n} {}", node.op.name()),
                None => n.to_string(),
            })
            .collect();
        let nodes = if nodes.is_empty() {
            "- (views only)".to_string()
        } else {
            nodes.join(", ")
        };
        let _ = writeln!(text, "  {}: {nodes}", cost.name);
    }
    let fallbacks: Vec<(usize, &minductor_kernel_ir::FallbackStep)> = program
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Step::Fallback(fb) => Some((i, fb)),
            _ => None,
        })
        .collect();
    if !fallbacks.is_empty() {
        text.push_str("\nfallbacks (run by the reference interpreter):\n");
        for (i, fb) in fallbacks {
            let _ = writeln!(
                text,
                "  k{i}_fallback_{}: {} {} because {}",
                fb.op.name(),
                fb.node,
                fb.op,
                fb.reason
            );
        }
    }
    text
}

/// Buffers each step reads and writes, in step order.
fn step_buffers(step: &Step) -> (Vec<BufferId>, Vec<BufferId>) {
    (step.reads(), step.writes())
}

fn step_name(index: usize, step: &Step) -> String {
    match step {
        Step::Kernel(k) => k.name.clone(),
        Step::Matmul(_) => format!("k{index}_matmul"),
        Step::ScatterAdd(_) => format!("k{index}_scatter_add"),
        Step::Attention(_) => format!("k{index}_attention"),
        Step::Fallback(fb) => format!("k{index}_fallback_{}", fb.op.name()),
    }
}

fn buffer_list(ids: &[BufferId]) -> String {
    let parts: Vec<String> = ids.iter().map(|b| b.to_string()).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The step order with the buffers each step reads and writes.
fn schedule_text(program: &Program) -> String {
    let mut text = String::new();
    for (i, step) in program.steps.iter().enumerate() {
        let (reads, writes) = step_buffers(step);
        let kind = match step {
            Step::Kernel(_) => "kernel",
            Step::Matmul(_) => "matmul",
            Step::ScatterAdd(_) => "scatter_add",
            Step::Attention(_) => "attention",
            Step::Fallback(_) => "fallback",
        };
        let _ = writeln!(
            text,
            "step {i}: {kind} {} reads {} writes {}",
            step_name(i, step),
            buffer_list(&reads),
            buffer_list(&writes)
        );
    }
    text
}

/// The buffer plan as text: every buffer with its kind, dtype, shape, bytes and the steps it is
/// live across (written first .. read last), then the totals by kind.
///
/// This lists the `Program`'s buffers one allocation each; when `plan_buffers` assigns arena
/// slots, its plan's `Display` replaces this function's body.
pub fn buffer_plan(program: &Program) -> String {
    let steps: Vec<(Vec<BufferId>, Vec<BufferId>)> =
        program.steps.iter().map(step_buffers).collect();
    let mut first_write: HashMap<BufferId, usize> = HashMap::new();
    let mut last_read: HashMap<BufferId, usize> = HashMap::new();
    for (i, (reads, writes)) in steps.iter().enumerate() {
        for &b in writes {
            first_write.entry(b).or_insert(i);
        }
        for &b in reads {
            last_read.insert(b, i);
        }
    }
    let mut rows: Vec<[String; 7]> = Vec::new();
    let mut totals: [(usize, usize); 3] = [(0, 0); 3];
    for (i, buffer) in program.buffers.iter().enumerate() {
        let id = BufferId(i as u32);
        let bytes = buffer.numel().unwrap_or(0) * buffer.dtype.size_bytes();
        let (kind, slot) = match buffer.kind {
            BufferKind::Input(n) => (format!("input {n}"), 0),
            BufferKind::Output => ("output".to_string(), 1),
            BufferKind::Intermediate => ("intermediate".to_string(), 2),
        };
        totals[slot].0 += 1;
        totals[slot].1 += bytes;
        let live = match (buffer.kind, first_write.get(&id), last_read.get(&id)) {
            (BufferKind::Input(_), _, Some(r)) => format!("in..{r}"),
            (BufferKind::Output, Some(w), _) => format!("{w}..out"),
            (_, Some(w), Some(r)) => format!("{w}..{r}"),
            (_, Some(w), None) => format!("{w}.."),
            (_, None, Some(r)) => format!("..{r}"),
            (_, None, None) => "-".to_string(),
        };
        let shape: Vec<String> = buffer.shape.iter().map(|d| d.to_string()).collect();
        rows.push([
            id.to_string(),
            kind,
            buffer.dtype.to_string(),
            format!("[{}]", shape.join(", ")),
            bytes.to_string(),
            live,
            buffer.node.to_string(),
        ]);
    }
    let header = ["buffer", "kind", "dtype", "shape", "bytes", "live", "node"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut text = String::new();
    let mut line = |cells: [&str; 7]| {
        let mut l = String::new();
        for (c, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let _ = match c {
                4 => write!(l, "{cell:>w$}  "),
                _ => write!(l, "{cell:<w$}  "),
            };
        }
        text.push_str(l.trim_end());
        text.push('\n');
    };
    line(header);
    for row in &rows {
        line([
            &row[0], &row[1], &row[2], &row[3], &row[4], &row[5], &row[6],
        ]);
    }
    for (label, (count, bytes)) in ["inputs", "outputs", "intermediates"].iter().zip(totals) {
        let _ = writeln!(text, "{label}: {count}, {bytes} bytes");
    }
    if let Some(plan) = &program.plan {
        let _ = write!(text, "{plan}");
    }
    text
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The prim graph in Graphviz DOT: one node per graph node (`%id op` and its type), an edge per
/// operand, and with a program each kernel's fused nodes drawn as `subgraph cluster_<kernel>`
/// and each GEMM as a filled cluster of its own.
pub fn graph_dot(prims: &Graph, program: Option<&Program>) -> String {
    // The step that computes each node (the first one, should two claim it).
    let mut owner: HashMap<NodeId, usize> = HashMap::new();
    let mut clusters: Vec<(String, StepKind, Vec<NodeId>)> = Vec::new();
    if let Some(program) = program {
        for (i, step) in program.steps.iter().enumerate() {
            // A GEMM's epilogue is drawn as a cluster of its own, next to the GEMM's.
            let mut parts = match step {
                Step::Kernel(k) => vec![(step_name(i, step), StepKind::Kernel, k.nodes.clone())],
                Step::Matmul(m) => vec![(step_name(i, step), StepKind::Matmul, vec![m.node])],
                Step::ScatterAdd(sc) => {
                    vec![(step_name(i, step), StepKind::ScatterAdd, vec![sc.node])]
                }
                Step::Attention(a) => {
                    vec![(step_name(i, step), StepKind::Attention, a.nodes.clone())]
                }
                Step::Fallback(fb) => {
                    vec![(step_name(i, step), StepKind::Fallback, vec![fb.node])]
                }
            };
            if let Step::Matmul(m) = step {
                if let Some(e) = &m.epilogue {
                    parts.push((e.name.clone(), StepKind::Kernel, e.nodes.clone()));
                }
            }
            for (name, kind, nodes) in parts {
                let nodes: Vec<NodeId> = nodes
                    .into_iter()
                    .filter(|n| n.index() < prims.len() && !owner.contains_key(n))
                    .collect();
                for &n in &nodes {
                    owner.insert(n, i);
                }
                clusters.push((name, kind, nodes));
            }
        }
    }
    let mut text = String::from("digraph minductor {\n");
    text.push_str("  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    let node_line = |id: NodeId| -> String {
        let node = prims.node(id);
        let shape = match node.op {
            Op::Input { .. } => ", shape=invhouse",
            Op::Constant { .. } => ", shape=plain",
            _ if node.op.is_view() => ", style=dashed",
            _ => "",
        };
        format!(
            "n{} [label=\"{}\"{shape}];",
            id.0,
            escape(&format!("{id} {}\n{}", node.op, node.ty))
        )
    };
    for (name, kind, nodes) in &clusters {
        let style = match kind {
            StepKind::Kernel => "style=rounded; color=blue;",
            StepKind::Matmul => "style=filled; fillcolor=lightyellow; color=orange;",
            StepKind::ScatterAdd => "style=filled; fillcolor=lightgrey; color=black;",
            StepKind::Fallback => "style=filled; fillcolor=mistyrose; color=red;",
            StepKind::Attention => "style=filled; fillcolor=lightcyan; color=darkgreen;",
        };
        let _ = writeln!(
            text,
            "  subgraph \"cluster_{}\" {{\n    label=\"{}\"; {style}",
            escape(name),
            escape(name)
        );
        for &n in nodes {
            let _ = writeln!(text, "    {}", node_line(n));
        }
        text.push_str("  }\n");
    }
    for id in prims.ids().filter(|id| !owner.contains_key(id)) {
        let _ = writeln!(text, "  {}", node_line(id));
    }
    for (index, node) in prims.nodes().iter().enumerate() {
        for input in &node.inputs {
            let _ = writeln!(text, "  n{} -> n{index};", input.0);
        }
    }
    for (i, out) in prims.outputs().iter().enumerate() {
        let _ = writeln!(
            text,
            "  out{i} [label=\"output {i}\", shape=house];\n  n{} -> out{i};",
            out.0
        );
    }
    text.push_str("}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile_with, trace, Backend};
    use minductor_ir::DType;

    #[test]
    fn dot_has_one_cluster_per_kernel_and_gemm_and_an_edge_per_operand() {
        let graph = trace(|t| {
            let a = t.input("a", DType::F32, &[5, 7]);
            let b = t.input("b", DType::F32, &[7, 9]);
            vec![a.matmul(&b).tanh().softmax(-1)]
        })
        .unwrap();
        let compiled = compile_with(&graph, Backend::Inductor).unwrap();
        let artifacts = compiled.artifacts();
        let prims = artifacts.prim_graph.as_ref().unwrap();
        let program = artifacts.program.as_ref().unwrap();
        let dot = graph_dot(prims, Some(program));
        assert!(dot.starts_with("digraph minductor {"), "{dot}");
        // The GEMM and its epilogue (tanh, softmax over its rows) are two clusters.
        assert_eq!(program.steps.len(), 1, "{program}");
        assert_eq!(dot.matches("subgraph \"cluster_").count(), 2, "{dot}");
        assert!(dot.contains("subgraph \"cluster_k0_matmul\""), "{dot}");
        let operands: usize = prims.nodes().iter().map(|n| n.inputs.len()).sum();
        let outputs = prims.outputs().len();
        assert_eq!(dot.matches(" -> ").count(), operands + outputs, "{dot}");
        assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "{dot}");
    }

    #[test]
    fn unwritable_dump_dir_is_a_warning_not_an_error() {
        let graph = trace(|t| vec![t.input("x", DType::F32, &[3]).exp()]).unwrap();
        let compiled = compile_with(&graph, Backend::Inductor).unwrap();
        // A path below a regular file cannot be created.
        let file = std::env::temp_dir().join(format!("minductor-not-a-dir-{}", std::process::id()));
        std::fs::write(&file, "x").unwrap();
        let written = dump_compiled(&file.join("dump"), &compiled);
        std::fs::remove_file(&file).unwrap();
        assert!(written.is_empty());
    }
}
