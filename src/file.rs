//! Reading a file without trusting what sits at its path: the config's files (the loader and
//! the reloader's fingerprint) and the TLS settings' PEM files are read through
//! [`read_regular`].
//!
//! Why: those paths are read again on every reload poll, and whatever is there gets opened.
//! A FIFO would block `open` until a writer appears (the watcher's thread hung, later edits
//! never loaded, nothing logged), and a link to `/dev/zero` or any other device would be read
//! until memory ran out. So a file is opened non-blocking (a FIFO opens at once), checked on
//! the open descriptor to be a regular file (so a swap between the check and the read cannot
//! slip a device in), and read up to a byte bound: anything else is a clear error, and a
//! reload keeps what it served.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read file: {0}")]
    Io(String),
    #[error("cannot read file: not a regular file ({0})")]
    NotRegular(&'static str),
    /// Larger than the bound the caller gave.
    #[error("file larger than {0} bytes")]
    TooLarge(u64),
}

/// Reads the regular file at `path` (symlinks followed), at most `max` bytes.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let io = |e: std::io::Error| ReadError::Io(e.to_string());
    let file = open_nonblocking(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind(&meta.file_type())));
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge(max));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The size may have changed since the stat: never read more than the bound.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(bytes)
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO does not wait for a writer; regular files ignore it.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        return "a directory";
    }
    "not a file"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn fifos_devices_and_oversized_files_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.yaml");
        mkfifo(&fifo);
        let err = read_regular(&fifo, 100).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read file: not a regular file (a FIFO)"
        );
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read_regular(&zero, 100).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read file: not a regular file (a character device)"
        );

        let file = dir.path().join("f.yaml");
        std::fs::write(&file, [b'x'; 60]).unwrap();
        assert_eq!(read_regular(&file, 60).unwrap().len(), 60);
        assert_eq!(read_regular(&file, 59), Err(ReadError::TooLarge(59)));
    }

    #[test]
    fn the_config_budget_is_taken_by_what_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.yaml");
        std::fs::write(&file, [b'x'; 60]).unwrap();
        let mut budget = 100;
        let read = crate::config::read_config_file;
        assert_eq!(read(&file, &mut budget, 100).unwrap().len(), 60);
        assert_eq!(budget, 40);
        let err = read(&file, &mut budget, 100).unwrap_err();
        assert!(err.contains("larger than --max-config-bytes 100"), "{err}");
        assert_eq!(budget, 40, "a refused file takes nothing");
    }
}
