//! The segment log ([`crate::log`]) as the restore engine's [`ChangelogLog`].

use std::path::{Path, PathBuf};

use super::engine::{Bounds, ChangelogLog};
use crate::source::{ChangelogSource, SourceError};

/// The segment log in a directory.
#[derive(Debug, Clone)]
pub struct SegmentLogDir(pub PathBuf);

impl SegmentLogDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl ChangelogLog for SegmentLogDir {
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, SourceError> {
        let o = crate::log::partition_offsets(&self.0, topic, partition)?;
        Ok(Bounds { start: o.start, end: o.end, last_stable: o.last_stable })
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, SourceError> {
        crate::log::open_committed_source(&self.0, topic, partition, start)
    }
}
