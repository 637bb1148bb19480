//! The vocabulary of a run's choices — which model, which normalisation, which parallel
//! strategy, which device — as enums defined below every layer that uses them (`config`, `nn`,
//! `train`, the backends). The compiler checks every `match` over them, clap and serde parse and
//! print them by the same lowercase names, and no lower layer has to reach up to a higher one for
//! a list of valid names.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Implements `Display` (the lowercase name) and `FromStr` (the same names, with an error that
/// lists them) for a fieldless enum.
macro_rules! named {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order they are listed in messages.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The lowercase name used on the command line, in configs and in JSON.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = anyhow::Error;
            fn from_str(s: &str) -> anyhow::Result<$ty> {
                $ty::ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
                    let names: Vec<&str> = $ty::ALL.iter().map(|k| k.name()).collect();
                    anyhow::anyhow!(
                        concat!("unknown ", $what, " '{}' (expected one of: {})"),
                        s,
                        names.join(", ")
                    )
                })
            }
        }
    };
}

/// Which convolution a model stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// GraphSAGE, mean aggregator with root weight.
    Sage,
    /// GCN with symmetric normalisation (self-loops are added by the caller).
    Gcn,
    /// GAT, multi-head.
    Gat,
    /// A graph-free MLP on the destination rows (baseline).
    Mlp,
}
named!(ModelKind, "model", { Sage => "sage", Gcn => "gcn", Gat => "gat", Mlp => "mlp" });

/// Which normalisation a layer applies to its input.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// No normalisation.
    #[default]
    None,
    /// Layer normalisation (learned gain and bias) on every row.
    Layer,
}
named!(NormKind, "norm", { None => "none", Layer => "layer" });

/// How weights and biases start.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum InitKind {
    /// Glorot-uniform weights and zero biases, as PyG's and DGL's graph layers start.
    #[default]
    Glorot,
    /// PyTorch's `nn.Linear` default (Kaiming-uniform with `a = √5`): weights and biases
    /// uniform in `±1/√fan_in`. The published heterophilous-benchmark models (Platonov et al.)
    /// and SliceGCN's are built from `nn.Linear`, and they train to higher scores from it.
    FanIn,
}
named!(InitKind, "init", { Glorot => "glorot", FanIn => "fan-in" });

/// How ranks share the work of a mini-batch (see `docs/cli.md`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Data parallel: each rank computes the seeds it owns.
    #[default]
    Gdp,
    /// Split parallel (GSplit): each (layer, vertex) is computed by its owner.
    Split,
    /// Destination-node parallel: the input layer of each destination on its owner.
    Dnp,
    /// Source-node parallel: input-layer partial sums on the sources' owners.
    Snp,
    /// Node-feature parallel (P3's push-pull): every rank holds a slice of the input
    /// features' columns and computes the input layer's partial sums on it for every rank's
    /// destinations; the upper layers run data parallel.
    Nfp,
    /// GDP across nodes, split inside a node.
    Hybrid,
    /// SliceGCN: each rank its own GCN on a slice of the features over the whole graph,
    /// slice outputs gathered into a shared classifier (a different model by design).
    Slicegcn,
    /// Resolved before training to one of the others by a dry-run estimate.
    Auto,
}
named!(Strategy, "strategy", {
    Gdp => "gdp", Split => "split", Dnp => "dnp", Snp => "snp", Nfp => "nfp", Hybrid => "hybrid",
    Slicegcn => "slicegcn", Auto => "auto",
});

impl Strategy {
    /// Built from the others: `hybrid` and `auto`.
    pub fn is_composed(self) -> bool {
        matches!(self, Strategy::Hybrid | Strategy::Auto)
    }
}

/// Where a rank computes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The CPU backend (ndarray + rayon).
    Cpu,
    /// The CUDA backend (cuBLAS and the NVRTC kernels of `cuda/`); an error when no CUDA
    /// driver, GPU or library is found.
    Cuda,
    /// CUDA when a driver and a GPU are present, else the CPU; the log says which and why.
    #[default]
    Auto,
}
named!(Device, "device", { Cpu => "cpu", Cuda => "cuda", Auto => "auto" });

/// The arithmetic of a device's matrix products.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Full fp32, as the CPU computes: the CUDA backend agrees with it to about 1e-5.
    #[default]
    Fp32,
    /// fp32 in and out, TF32 tensor cores inside the GPU's products (faster, about 1e-3
    /// relative); the CPU ignores it.
    Tf32,
}
named!(Precision, "precision", { Fp32 => "fp32", Tf32 => "tf32" });

/// Whether MPI is handed device memory (`--cuda-aware-mpi`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum CudaAwareMpi {
    /// Device pointers straight to MPI; an error when the MPI library is not found CUDA-aware.
    On,
    /// Device rows staged through host memory for every collective.
    Off,
    /// `on` when the MPI library says it is CUDA-aware, else `off`; the log says which.
    #[default]
    Auto,
}
named!(CudaAwareMpi, "cuda-aware-mpi setting", { On => "on", Off => "off", Auto => "auto" });

/// Whether GDP mini-batch training prepares the next batch (sampling, input rows) on a second
/// thread while the current one trains.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Prefetch {
    /// On where the model runs on a device (the host's cores are then free for the next
    /// batch), off on the CPU backend (where both would share the same cores; measured no
    /// faster, see `docs/architecture.md`).
    #[default]
    Auto,
    /// Prepare batch b+1 while batch b trains, where it applies (see `docs/cli.md`).
    On,
    /// Prepare every batch when its step begins.
    Off,
}
named!(Prefetch, "prefetch", { Auto => "auto", On => "on", Off => "off" });

/// The per-rank cache of hot remote feature rows: a size in MiB (0: no cache), or `auto`
/// (APT's sizing: every remote row the presampling reads, as far as a share of the node's
/// available memory allows; `train::cache::budget_bytes`). Written as a number or `"auto"`
/// on the command line, in configs and in JSON.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    MiB(f64),
    Auto,
}

impl Default for CacheSize {
    fn default() -> CacheSize {
        CacheSize::MiB(0.0)
    }
}

impl CacheSize {
    /// Whether no cache is wanted.
    pub fn is_off(self) -> bool {
        self == CacheSize::MiB(0.0)
    }

    /// Why the size is not usable (negative, not finite), or `None`.
    pub fn invalid(self) -> Option<String> {
        match self {
            CacheSize::MiB(m) if !(m >= 0.0 && m.is_finite()) => {
                Some(format!("{m} must be `auto` or a non-negative size in MiB"))
            }
            _ => None,
        }
    }
}

impl fmt::Display for CacheSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSize::MiB(m) => write!(f, "{m}"),
            CacheSize::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for CacheSize {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<CacheSize> {
        if s == "auto" {
            return Ok(CacheSize::Auto);
        }
        let size = s
            .parse::<f64>()
            .map(CacheSize::MiB)
            .map_err(|_| anyhow::anyhow!("cache size '{s}' is neither `auto` nor a size in MiB"))?;
        match size.invalid() {
            Some(why) => Err(anyhow::anyhow!("cache size {why}")),
            None => Ok(size),
        }
    }
}

impl Serialize for CacheSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CacheSize::MiB(m) => s.serialize_f64(*m),
            CacheSize::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for CacheSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CacheSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Spelled {
            Number(f64),
            Word(String),
        }
        match Spelled::deserialize(d)? {
            Spelled::Number(m) => Ok(CacheSize::MiB(m)),
            Spelled::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_every_spelling() {
        for k in ModelKind::ALL {
            assert_eq!(k.name().parse::<ModelKind>().unwrap(), *k);
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{k}\""));
            let v = <ModelKind as clap::ValueEnum>::from_str(k.name(), false).unwrap();
            assert_eq!(v, *k);
        }
        for k in Strategy::ALL {
            assert_eq!(k.name().parse::<Strategy>().unwrap(), *k);
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{k}\""));
        }
        for k in Device::ALL {
            assert_eq!(k.name().parse::<Device>().unwrap(), *k);
        }
        for k in CudaAwareMpi::ALL {
            assert_eq!(k.name().parse::<CudaAwareMpi>().unwrap(), *k);
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{k}\""));
        }
        let err = "transformer".parse::<ModelKind>().unwrap_err().to_string();
        assert!(
            err.contains("transformer") && err.contains("sage, gcn, gat, mlp"),
            "{err}"
        );
        let err = "batch".parse::<NormKind>().unwrap_err().to_string();
        assert!(err.contains("none, layer"), "{err}");
        assert!(Strategy::Auto.is_composed() && !Strategy::Snp.is_composed());
    }

    #[test]
    fn cache_sizes_are_numbers_or_auto_everywhere() {
        for (text, size) in [("auto", CacheSize::Auto), ("64", CacheSize::MiB(64.0))] {
            assert_eq!(text.parse::<CacheSize>().unwrap(), size);
            let json = serde_json::to_string(&size).unwrap();
            assert_eq!(serde_json::from_str::<CacheSize>(&json).unwrap(), size);
        }
        assert_eq!(serde_json::to_string(&CacheSize::Auto).unwrap(), "\"auto\"");
        assert_eq!(
            serde_json::from_str::<CacheSize>("0").unwrap(),
            CacheSize::MiB(0.0)
        );
        assert!(CacheSize::default().is_off() && !CacheSize::Auto.is_off());
        for bad in ["big", "-1", "inf", "NaN"] {
            let err = bad.parse::<CacheSize>().unwrap_err().to_string();
            assert!(err.contains("auto"), "{bad}: {err}");
        }
        assert!(serde_json::from_str::<CacheSize>("\"lots\"").is_err());
    }
}

/// How Adam's learning rate moves over a run's epochs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// `lr` throughout.
    #[default]
    Constant,
    /// Cosine annealing from `lr` to 0 over `epochs` (PyTorch's `CosineAnnealingLR`,
    /// `T_max = epochs`, `eta_min = 0`), stepped once per epoch.
    Cosine,
}
named!(LrSchedule, "lr schedule", { Constant => "constant", Cosine => "cosine" });
