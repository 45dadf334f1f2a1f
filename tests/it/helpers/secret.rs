//! A Kubernetes Secret volume on disk, laid out and updated the way the kubelet does it: each
//! generation's files in a `..TIMESTAMP` directory, `..data` a symlink to the current one, and
//! every file name a symlink through `..data`. An update writes the new generation's directory,
//! then renames a fresh symlink over `..data`, so a reader sees one generation or the next,
//! never a mix, and the visible paths never change.
//!
//! Files are world-readable (mode 0644, directories 0755) like a Secret mounted with
//! Kubernetes' default mode, so a process running as another user (65534) reads them too.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

pub struct SecretVolume {
    pub dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    /// The volume in `dir` (created), holding `files` (name, content).
    pub fn new(dir: &Path, files: &[(&str, &str)]) -> SecretVolume {
        std::fs::create_dir_all(dir).expect("create the volume directory");
        set_mode(dir, 0o755);
        let mut volume = SecretVolume {
            dir: dir.to_owned(),
            generation: 0,
        };
        volume.update(files);
        for (name, _) in files {
            symlink(Path::new("..data").join(name), dir.join(name)).expect("file symlink");
        }
        volume
    }

    /// The visible path of file `name` (a symlink through `..data`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Swaps in a new generation holding `files` (the same names as at creation).
    pub fn update(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let generation = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.generation,
            std::process::id()
        );
        let target = self.dir.join(&generation);
        std::fs::create_dir(&target).expect("generation directory");
        set_mode(&target, 0o755);
        for (name, content) in files {
            let path = target.join(name);
            std::fs::write(&path, content).expect("write a Secret file");
            set_mode(&path, 0o644);
        }
        let staged = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        symlink(&generation, &staged).expect("staged ..data symlink");
        std::fs::rename(&staged, self.dir.join("..data")).expect("swap ..data");
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
