//! Named objects in a local directory: one file per object, written whole or not at all.

use std::path::PathBuf;

use async_trait::async_trait;

use super::{ObjectError, ObjectStore};

/// Temp files start with this; no object name does, so a listing never shows one.
const TEMP_PREFIX: &str = ".tmp-";

/// Objects in a local directory (the journal's and the archive's home without S3). A write
/// goes to a temp file that is flushed and renamed into place, then the directory is
/// flushed: a crash leaves the old object or the new one, never a torn one.
pub struct DirObjects {
    root: PathBuf,
}

impl DirObjects {
    /// The objects under `root`, created if missing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }
}

#[async_trait]
impl ObjectStore for DirObjects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError> {
        let path = self.root.join(name);
        let tmp = self.root.join(format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            // Nested names (`memory/…`) get their directory on first use.
            if let Err(e) = std::fs::rename(&tmp, &path) {
                match path.parent() {
                    Some(parent) if e.kind() == std::io::ErrorKind::NotFound => {
                        std::fs::create_dir_all(parent)?;
                        std::fs::rename(&tmp, &path)?;
                    }
                    _ => {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(e);
                    }
                }
            }
            if let Some(parent) = path.parent()
                && let Ok(d) = std::fs::File::open(parent)
            {
                let _ = d.sync_all();
            }
            Ok(())
        })
        .await
        .map_err(|e| ObjectError::Unavailable(e.to_string()))??;
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError> {
        match tokio::fs::read(self.root.join(name)).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError> {
        let (dir, file_prefix, rel) = match prefix.rsplit_once('/') {
            Some((d, f)) => (self.root.join(d), f.to_owned(), format!("{d}/")),
            None => (self.root.clone(), prefix.to_owned(), String::new()),
        };
        let mut out = Vec::new();
        let mut rd = match tokio::fs::read_dir(&dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        while let Some(e) = rd.next_entry().await? {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&file_prefix) && !name.starts_with(TEMP_PREFIX) {
                out.push(format!("{rel}{name}"));
            }
        }
        Ok(out)
    }

    async fn delete(&self, name: &str) -> Result<(), ObjectError> {
        match tokio::fs::remove_file(self.root.join(name)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_name_is_listed_whatever_its_suffix_and_temp_files_never() {
        let dir = tempfile::tempdir().unwrap();
        let objects = DirObjects::open(dir.path()).unwrap();
        objects.put("memory/head-1", b"h".to_vec()).await.unwrap();
        objects
            .put("memory/head-2.json", b"j".to_vec())
            .await
            .unwrap();
        std::fs::write(dir.path().join("memory/.tmp-1-2"), b"torn").unwrap();
        let mut names = objects.list("memory/head-").await.unwrap();
        names.sort();
        assert_eq!(names, ["memory/head-1", "memory/head-2.json"]);
        assert_eq!(objects.list("memory/").await.unwrap().len(), 2);
        assert_eq!(
            objects.get("memory/head-1").await.unwrap(),
            Some(b"h".to_vec())
        );
        objects.delete("memory/head-1").await.unwrap();
        objects.delete("memory/head-1").await.unwrap();
        assert_eq!(objects.get("memory/head-1").await.unwrap(), None);
    }
}
