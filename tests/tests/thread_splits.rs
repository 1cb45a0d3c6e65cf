//! Results are the same bits at every thread count, for the splits many cores get: GEMMs cut
//! into rows and columns of tiles (plain, stacked batches, streamed), convolutions cut into
//! parts of images (implicit GEMM and Winograd), causal attention with paired runs and one
//! item per q head, row kernels cut with aligned boundaries. Each workload (suite shapes made
//! smaller so 64 threads on a small machine stay quick) runs at 1 thread, then at thread
//! counts up to 64, and every output must match bit for bit.

use minductor::compile;
use minductor_tools::workloads::{self, Workload};

fn same_bits_at_every_thread_count(workload: &Workload) {
    let compiled = compile(&workload.graph).unwrap();
    minductor::set_num_threads(1).unwrap();
    let once = compiled.call(&workload.inputs);
    minductor::set_num_threads(0).unwrap();
    let once: Vec<Vec<f32>> = once
        .unwrap()
        .iter()
        .map(|t| t.to_vec::<f32>().unwrap())
        .collect();
    for threads in [2, 3, 7, 16, 64] {
        minductor::set_num_threads(threads).unwrap();
        let again = compiled.call(&workload.inputs);
        minductor::set_num_threads(0).unwrap();
        for (i, (a, b)) in again.unwrap().iter().zip(&once).enumerate() {
            let a = a.to_vec::<f32>().unwrap();
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{}: output {i} differs at {threads} threads",
                workload.name
            );
        }
    }
}

#[test]
fn llama_block_gives_the_same_bits_on_any_thread_count() {
    // Stacked GEMMs over [2·128, 256] (2-D cuts), causal attention with grouped heads.
    same_bits_at_every_thread_count(&workloads::llama_block(2, 128, 256, 4, 2, 704).unwrap());
}

#[test]
fn attention_block_gives_the_same_bits_on_any_thread_count() {
    same_bits_at_every_thread_count(&workloads::attention(2, 128, 256, 4, 512).unwrap());
}

#[test]
fn resnet_block_gives_the_same_bits_on_any_thread_count() {
    // Two images of 32 channels, 28x28: parts of images from 3 threads on.
    same_bits_at_every_thread_count(&workloads::resnet_block(2, 32, 28).unwrap());
}

#[test]
fn mlp_and_row_kernels_give_the_same_bits_on_any_thread_count() {
    same_bits_at_every_thread_count(&workloads::mlp_workload(128, 256, 1024).unwrap());
    same_bits_at_every_thread_count(&workloads::softmax(512, 256).unwrap());
    same_bits_at_every_thread_count(&workloads::pointwise_gelu(100_003).unwrap());
}
