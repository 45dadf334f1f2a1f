//! Reading a config file without trusting what sits at its path: the loader and the reloader's
//! fingerprint read every file through [`read_file`].
//!
//! Why: the config path is read again on every reload poll, and whatever is there gets opened.
//! A FIFO would block `open` until a writer appears (the reload thread hung, later edits never
//! loaded, nothing logged), and a link to `/dev/zero` or any other device would be read until
//! memory ran out. So a file is opened non-blocking (a FIFO opens at once), checked on the open
//! descriptor to be a regular file (so a swap between the check and the read cannot slip a
//! device in), and read up to what is left of the config's byte budget
//! (`--max-config-bytes`): anything else is a clear error naming the file, and a reload keeps
//! the previous config.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Reads the regular file at `path` (symlinks followed), taking its size from `budget`, the
/// bytes the config may still read; `limit` is the whole budget, for the message.
pub(crate) fn read_file(path: &Path, budget: &mut u64, limit: u64) -> Result<Vec<u8>, String> {
    let file = open_nonblocking(path).map_err(|e| format!("cannot read file: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read file: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "cannot read file: not a regular file ({})",
            kind(&meta.file_type())
        ));
    }
    let too_large = || {
        format!("the config is larger than --max-config-bytes {limit} (all of its files together)")
    };
    if meta.len() > *budget {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The size may have changed since the stat: never read more than the budget.
    file.take(budget.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read file: {e}"))?;
    let read = bytes.len() as u64;
    if read > *budget {
        return Err(too_large());
    }
    *budget -= read;
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
        let mut budget = 100;
        let err = read_file(&fifo, &mut budget, 100).unwrap_err();
        assert_eq!(err, "cannot read file: not a regular file (a FIFO)");
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read_file(&zero, &mut budget, 100).unwrap_err();
        assert_eq!(
            err,
            "cannot read file: not a regular file (a character device)"
        );

        let file = dir.path().join("f.yaml");
        std::fs::write(&file, [b'x'; 60]).unwrap();
        assert_eq!(read_file(&file, &mut budget, 100).unwrap().len(), 60);
        assert_eq!(budget, 40);
        let err = read_file(&file, &mut budget, 100).unwrap_err();
        assert!(err.contains("larger than --max-config-bytes 100"), "{err}");
        assert_eq!(budget, 40, "a refused file takes nothing");
    }
}
