//! Which transport a process launched by torchrun uses, by the device it trains on: NCCL for a
//! CUDA run (where the `nccl` feature is built), Gloo for the CPU, or what a `--comm`-style
//! setting names. Outside torchrun the choice is `world`'s: the MPI job or one process.

use super::Communicator;
use crate::error::{Error, Result};
use tch::Device;

/// `--comm auto|gloo|nccl`: the c10d backend of a run launched by torchrun.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CommChoice {
    /// NCCL for a CUDA run where this build has it, Gloo otherwise; outside torchrun, the MPI
    /// job or one process.
    #[default]
    Auto,
    /// c10d on Gloo: host memory and CUDA tensors (through host memory).
    Gloo,
    /// c10d on NCCL: CUDA tensors, GPU to GPU; host-side collectives on Gloo.
    Nccl,
}

/// Whether this build has c10d on NCCL: the `nccl` feature, compiled where NCCL's and CUDA's
/// headers were present (`build.rs`).
pub const NCCL_BUILT: bool = cfg!(dpcomp_nccl);

/// Whether this build has c10d on Gloo (the `gloo` feature).
pub const GLOO_BUILT: bool = cfg!(feature = "gloo");

/// The transport `world_on` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// `world()`: the MPI job or one process (or Gloo under torchrun, as `world` decides).
    World,
    /// A c10d process group on Gloo.
    Gloo,
    /// A c10d process group on NCCL, with Gloo for host memory.
    Nccl,
}

/// What this process has: the facts `pick` decides from (a value so that a test can state any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// torchrun's variables are set (`gloo::Rendezvous::launched`).
    pub launched_by_torchrun: bool,
    /// `NCCL_BUILT`.
    pub nccl_built: bool,
    /// `GLOO_BUILT`.
    pub gloo_built: bool,
    /// CUDA devices LibTorch sees.
    pub gpus: usize,
}

impl Facts {
    /// This process's facts.
    pub fn here() -> Facts {
        #[cfg(feature = "gloo")]
        let launched = super::gloo::Rendezvous::launched(|name| std::env::var(name).ok());
        #[cfg(not(feature = "gloo"))]
        let launched = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
            .iter()
            .all(|name| std::env::var(name).is_ok());
        Facts {
            launched_by_torchrun: launched,
            nccl_built: NCCL_BUILT,
            gloo_built: GLOO_BUILT,
            gpus: tch::Cuda::device_count().max(0) as usize,
        }
    }
}

/// The transport for a run on `device` under `choice`; an error (naming `--comm`) says why a
/// choice cannot be had here.
pub fn pick(choice: CommChoice, device: Device, facts: Facts) -> std::result::Result<Pick, String> {
    let torchrun = "a c10d process group needs torchrun's variables (RANK, WORLD_SIZE, \
                    MASTER_ADDR, MASTER_PORT): launch with `torchrun --nproc-per-node W \
                    --no-python dpcomp ...`";
    match choice {
        CommChoice::Auto => Ok(match facts {
            Facts {
                launched_by_torchrun: false,
                ..
            } => Pick::World,
            Facts {
                nccl_built: true, ..
            } if device.is_cuda() => Pick::Nccl,
            Facts {
                gloo_built: true, ..
            } => Pick::Gloo,
            _ => Pick::World,
        }),
        CommChoice::Gloo if !facts.gloo_built => Err(
            "--comm gloo: this dpcomp was built without c10d on Gloo (the `gloo` cargo feature, \
             with Debian's libgloo-dev; scripts/setup.sh installs it)"
                .to_string(),
        ),
        CommChoice::Gloo if !facts.launched_by_torchrun => Err(format!("--comm gloo: {torchrun}")),
        CommChoice::Gloo => Ok(Pick::Gloo),
        CommChoice::Nccl if !facts.nccl_built => Err(
            "--comm nccl: this dpcomp was built without NCCL (the `nccl` cargo feature, compiled \
             where NCCL's and the CUDA runtime's headers are installed: scripts/setup.sh installs \
             them); use --comm gloo"
                .to_string(),
        ),
        CommChoice::Nccl if facts.gpus == 0 => Err(
            "--comm nccl: NCCL needs CUDA tensors; this process sees no GPU (LibTorch finds no \
             CUDA device): use --comm gloo on the CPU"
                .to_string(),
        ),
        CommChoice::Nccl if !device.is_cuda() => Err(format!(
            "--comm nccl: NCCL needs CUDA tensors, and this run's device is {device:?}: use \
             --device cuda, or --comm gloo"
        )),
        CommChoice::Nccl if !facts.launched_by_torchrun => Err(format!("--comm nccl: {torchrun}")),
        CommChoice::Nccl => Ok(Pick::Nccl),
    }
}

/// The job this process belongs to for a run on `device`, by `choice` (`pick`), with the
/// transport's name ("c10d on NCCL", "c10d on Gloo", or `world`'s). An error says why the
/// choice cannot be had here: NCCL asked for in a build without it, without a GPU, for a CPU
/// run, or outside torchrun.
pub fn world_on(
    device: Device,
    choice: CommChoice,
) -> Result<(Box<dyn Communicator>, &'static str)> {
    let facts = Facts::here();
    let picked = pick(choice, device, facts).map_err(|what| Error::Comm {
        rank: std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
        size: std::env::var("WORLD_SIZE")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(1),
        what,
    })?;
    match picked {
        #[cfg(dpcomp_nccl)]
        Pick::Nccl => Ok((Box::new(super::nccl::NcclComm::from_env()?), "c10d on NCCL")),
        #[cfg(feature = "gloo")]
        Pick::Gloo => Ok((Box::new(super::gloo::GlooComm::from_env()?), "c10d on Gloo")),
        _ => super::world(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Facts = Facts {
        launched_by_torchrun: true,
        nccl_built: true,
        gloo_built: true,
        gpus: 1,
    };

    #[test]
    fn auto_takes_nccl_for_cuda_and_gloo_for_the_cpu_under_torchrun_only() {
        let cuda = Device::Cuda(0);
        assert_eq!(pick(CommChoice::Auto, cuda, ALL), Ok(Pick::Nccl));
        assert_eq!(pick(CommChoice::Auto, Device::Cpu, ALL), Ok(Pick::Gloo));
        let no_nccl = Facts {
            nccl_built: false,
            ..ALL
        };
        assert_eq!(pick(CommChoice::Auto, cuda, no_nccl), Ok(Pick::Gloo));
        let outside = Facts {
            launched_by_torchrun: false,
            ..ALL
        };
        assert_eq!(pick(CommChoice::Auto, cuda, outside), Ok(Pick::World));
        assert_eq!(pick(CommChoice::Gloo, cuda, ALL), Ok(Pick::Gloo));
    }

    #[test]
    fn nccl_that_cannot_be_had_says_why() {
        let cases = [
            (
                Facts {
                    nccl_built: false,
                    ..ALL
                },
                Device::Cuda(0),
                "built without NCCL",
            ),
            (
                Facts { gpus: 0, ..ALL },
                Device::Cpu,
                "NCCL needs CUDA tensors; this process sees no GPU",
            ),
            (ALL, Device::Cpu, "this run's device is Cpu"),
            (
                Facts {
                    launched_by_torchrun: false,
                    ..ALL
                },
                Device::Cuda(0),
                "needs torchrun's variables",
            ),
        ];
        for (facts, device, want) in cases {
            let e = pick(CommChoice::Nccl, device, facts).unwrap_err();
            assert!(e.starts_with("--comm nccl: ") && e.contains(want), "{e}");
        }
        let e = pick(
            CommChoice::Gloo,
            Device::Cpu,
            Facts {
                gloo_built: false,
                ..ALL
            },
        )
        .unwrap_err();
        assert!(e.contains("built without c10d on Gloo"), "{e}");
    }
}
