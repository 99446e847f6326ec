//! `dpcomp bench`: the benchmarks whose numbers docs/results/benchmarks.md quotes.

use anyhow::Result;
use clap::Subcommand;
use dpcomp_lab::bench;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Mean time of one non-private training step on a fixed batch.
    Train(bench::TrainBenchArgs),
    /// Non-private versus DP-SGD step time and peak memory, side by side.
    Dp(bench::DpBenchArgs),
    /// Non-private versus DP-SGD step time and peak memory of a pre-trained transformer
    /// fine-tuned in one mode (LoRA, full, BiTFiT, last layers): MiniLM or GPT-2 small's shape.
    Finetune(bench::finetune::FinetuneBenchArgs),
    /// A compressor's compress + decompress time against the model's backward pass, and its
    /// wire bits against dense fp32.
    Compress(bench::compress::CompressBenchArgs),
    /// A data-parallel step with each compressor on W = 1, 2, 4 MPI ranks (compute, encode,
    /// communication, decode, bytes), and modelled over 1/10/100 Gb/s links up to W = 64.
    Comm(bench::comm::CommBenchArgs),
    /// FL-CS's chunked OWL-QN reconstruction per round against one round of client training
    /// (n = 10^5 and 10^6), and the recovery error of first versus random DCT rows.
    FlReconstruction(bench::fl::FlBenchArgs),
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Train(args) => bench::train_bench(args)?,
        BenchCommand::Dp(args) => bench::dp_bench(args)?,
        BenchCommand::Finetune(args) => bench::finetune::finetune_bench(args)?,
        BenchCommand::Compress(args) => bench::compress::compress_bench(args)?,
        BenchCommand::Comm(args) => bench::comm::comm_bench(args)?,
        BenchCommand::FlReconstruction(args) => bench::fl::fl_bench(args)?,
    }
    Ok(())
}
