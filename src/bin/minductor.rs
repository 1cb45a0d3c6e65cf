//! The `minductor` command line: `minductor golden DIR` runs PyTorch reference cases.

use clap::{Parser, Subcommand};
use minductor::golden::{default_golden_dir, run_golden};
use minductor::Backend;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "minductor",
    about = "torch.compile's pipeline in Rust for CPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every case of DIR/manifest.json on each backend and compare with PyTorch's outputs.
    Golden {
        /// Folder holding manifest.json and the .safetensors files (default: ../shared/golden).
        dir: Option<PathBuf>,
        /// Comma-separated backends to run.
        #[arg(long, default_value = "eager,inductor")]
        backends: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Golden { dir, backends } => {
            let backends: Result<Vec<Backend>, _> =
                backends.split(',').map(|b| b.trim().parse()).collect();
            let backends = match backends {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let dir = dir.unwrap_or_else(default_golden_dir);
            match run_golden(&dir, &backends) {
                Ok(report) => {
                    print!("{}", report.render());
                    if report.failed() == 0 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
