//! Whether a dataset is one object or a tree of them: the first thing a catalog entry says, and what every
//! other part of the data layer (embedded bytes, sources, handles) branches on.

/// Whether a dataset is one object or a tree of them (DataSets.jl's `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// One object (`type = "Blob"`, or `"File"` in later DataSets.jl versions).
    Blob,
    /// A directory tree or object-store prefix (`type = "BlobTree"` or `"FileTree"`).
    BlobTree,
}

impl DataKind {
    /// The name DataSets.jl uses.
    pub fn as_str(self) -> &'static str {
        match self {
            DataKind::Blob => "Blob",
            DataKind::BlobTree => "BlobTree",
        }
    }
}
