//! Certificates and keys of the local control plane, made with the `openssl` CLI: a CA, the
//! API server's serving certificate, an admin client certificate (system:masters) and the
//! service-account signing key pair.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::HarnessError;

pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn ca_crt(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    pub fn apiserver_crt(&self) -> PathBuf {
        self.dir.join("apiserver.crt")
    }
    pub fn apiserver_key(&self) -> PathBuf {
        self.dir.join("apiserver.key")
    }
    pub fn admin_crt(&self) -> PathBuf {
        self.dir.join("admin.crt")
    }
    pub fn admin_key(&self) -> PathBuf {
        self.dir.join("admin.key")
    }
    pub fn sa_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }
    pub fn sa_pub(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }

    pub fn create(dir: &Path) -> Result<Self, HarnessError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        let pki = Self {
            dir: dir.to_path_buf(),
        };
        let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=cairn-harness-ca",
            "-keyout",
            &d("ca.key"),
            "-out",
            &d("ca.crt"),
        ])?;
        pki.signed("apiserver", "/CN=kube-apiserver",
            "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n")?;
        pki.signed(
            "admin",
            "/O=system:masters/CN=cairn-admin",
            "extendedKeyUsage=clientAuth\n",
        )?;
        openssl(&["genrsa", "-out", &d("sa.key"), "2048"])?;
        openssl(&["rsa", "-in", &d("sa.key"), "-pubout", "-out", &d("sa.pub")])?;
        Ok(pki)
    }

    fn signed(&self, name: &str, subject: &str, ext: &str) -> Result<(), HarnessError> {
        let d = |f: String| self.dir.join(f).to_string_lossy().into_owned();
        let ext_file = d(format!("{name}.ext"));
        std::fs::write(&ext_file, ext)
            .map_err(|e| HarnessError::io("writing a certificate extension file", e))?;
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            &d(format!("{name}.key")),
            "-out",
            &d(format!("{name}.csr")),
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &d(format!("{name}.csr")),
            "-CA",
            &d("ca.crt".into()),
            "-CAkey",
            &d("ca.key".into()),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &ext_file,
            "-out",
            &d(format!("{name}.crt")),
        ])?;
        Ok(())
    }
}

fn openssl(args: &[&str]) -> Result<(), HarnessError> {
    let out = Command::new("openssl").args(args).output().map_err(|e| {
        HarnessError::io("running openssl (install it: apt-get install openssl)", e)
    })?;
    if !out.status.success() {
        return Err(HarnessError::Setup(format!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}
