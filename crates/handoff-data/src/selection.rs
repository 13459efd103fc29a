//! What a dataset spec selects: the dataset with the spec's query and fragment ([`Selection`]), and what
//! opening it gives ([`Opened`]), as DataSets.jl's `dataset(project, spec)` and `open(dataset)`.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

use crate::blob::Blob;
use crate::dataset::DataSet;
use crate::spec::DataSpec;
use crate::tree::BlobTree;

/// A dataset found by a spec, with the spec's query and fragment (DataSets.jl's `dataspec`). It dereferences
/// to the [`DataSet`].
#[derive(Debug, Clone)]
pub struct Selection {
    dataset: Arc<DataSet>,
    spec: DataSpec,
}

impl Selection {
    pub(crate) fn new(dataset: Arc<DataSet>, spec: DataSpec) -> Selection {
        Selection { dataset, spec }
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<DataSet> {
        &self.dataset
    }

    /// The parsed spec.
    pub fn spec(&self) -> &DataSpec {
        &self.spec
    }

    /// The spec's query, percent-decoded (`None` without `?`).
    pub fn query(&self) -> Option<&BTreeMap<String, String>> {
        self.spec.query.as_ref()
    }

    /// The spec's fragment, percent-decoded (`None` without `#`).
    pub fn fragment(&self) -> Option<&str> {
        self.spec.fragment.as_deref()
    }
}

impl Deref for Selection {
    type Target = DataSet;

    fn deref(&self) -> &DataSet {
        &self.dataset
    }
}

/// An opened spec: one blob, or a tree (a whole `BlobTree` dataset, or a folder of one).
#[derive(Debug, Clone)]
pub enum Opened {
    /// A `Blob` dataset, or a file a fragment selected in a tree.
    Blob(Blob),
    /// A `BlobTree` dataset, or a folder a fragment selected in it.
    Tree(BlobTree),
}

impl Opened {
    /// The blob, if this is one.
    pub fn into_blob(self) -> Option<Blob> {
        match self {
            Opened::Blob(b) => Some(b),
            Opened::Tree(_) => None,
        }
    }

    /// The tree, if this is one.
    pub fn into_tree(self) -> Option<BlobTree> {
        match self {
            Opened::Tree(t) => Some(t),
            Opened::Blob(_) => None,
        }
    }
}
