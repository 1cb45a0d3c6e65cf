//! Prints the Cranelift IR of the softmax / layer_norm / gelu kernels and writes each kernel's
//! machine code to `/tmp/<kernel>.bin` (disassemble with
//! `objdump -D -b binary -mi386:x86-64 /tmp/<kernel>.bin`).
//! `cargo run --release -p minductor-benches --example dump_ir -- softmax|layernorm|gelu`
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use minductor::codegen_cpu::lower::{kernel_function, lower_kernel};
use minductor::compile;
use minductor::passes::kernel::Step;
use minductor_benches::{layer_norm, pointwise_gelu, softmax};

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "softmax".into());
    let (graph, _) = match which.as_str() {
        "layernorm" => layer_norm(64, 64),
        "gelu" => pointwise_gelu(64),
        _ => softmax(64, 64),
    };
    let compiled = compile(&graph).expect("compiles");
    let program = compiled.artifacts().program.clone().expect("inductor");
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").unwrap();
    let isa = cranelift_native::builder()
        .unwrap()
        .finish(settings::Flags::new(flags))
        .unwrap();
    for step in &program.steps {
        let Step::Kernel(kernel) = step else { continue };
        let mut ctx =
            cranelift_codegen::Context::for_function(kernel_function(isa.default_call_conv()));
        let mut fctx = FunctionBuilderContext::new();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            lower_kernel(&mut b, kernel, &program);
            b.finalize(isa.frontend_config());
        }
        println!("== {}\n{}", kernel.name, ctx.func.display());
        let code = ctx
            .compile(&*isa, &mut Default::default())
            .expect("compiles");
        let path = format!("/tmp/{}.bin", kernel.name);
        std::fs::write(&path, code.code_buffer()).unwrap();
        println!("wrote {path}");
    }
}
