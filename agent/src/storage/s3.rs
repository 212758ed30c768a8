//! Named objects in S3 or any S3-compatible store, under one key prefix.

use std::fmt;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use aws_sdk_s3::primitives::ByteStream;

use super::{ObjectError, ObjectStore};

/// Objects in one bucket under a key prefix: the object `name` is the key `<prefix><name>`.
/// Every request is bounded by the client's timeouts and retries (`crate::ccr::S3Config`).
#[derive(Clone)]
pub struct S3Objects {
    client: Client,
    bucket: String,
    prefix: String,
    content_type: &'static str,
}

impl S3Objects {
    /// `prefix` ends with `/` (a `crate::ccr::SessionScope` prefix). Objects are stored as
    /// `application/octet-stream` unless [`S3Objects::with_content_type`] says otherwise.
    pub fn new(client: Client, bucket: &str, prefix: String) -> Self {
        Self {
            client,
            bucket: bucket.to_owned(),
            prefix,
            content_type: "application/octet-stream",
        }
    }

    /// The `Content-Type` every object is written with.
    pub fn with_content_type(mut self, content_type: &'static str) -> Self {
        self.content_type = content_type;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

#[async_trait]
impl ObjectStore for S3Objects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(name))
            .content_type(self.content_type)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| unavailable("put", &e))?;
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError> {
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.key(name))
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(unavailable("get", &e)),
        };
        let body = out.body.collect().await.map_err(|e| {
            ObjectError::Unavailable(format!("S3 get: reading body: {}", DisplayErrorContext(e)))
        })?;
        Ok(Some(body.into_bytes().to_vec()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError> {
        let full = self.key(prefix);
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(|e| unavailable("list", &e))?;
            for o in page.contents() {
                if let Some(k) = o.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    out.push(k.to_owned());
                }
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn delete(&self, name: &str) -> Result<(), ObjectError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.key(name))
            .send()
            .await
            .map_err(|e| unavailable("delete", &e))?;
        Ok(())
    }
}

/// S3 says there is no such object (`NoSuchKey`; some compatible stores say `NotFound`).
fn is_not_found<E, R>(e: &SdkError<E, R>) -> bool
where
    E: aws_sdk_s3::error::ProvideErrorMetadata,
{
    match e {
        SdkError::ServiceError(service) => {
            matches!(service.err().code(), Some("NoSuchKey" | "NotFound"))
        }
        _ => false,
    }
}

fn unavailable<E, R>(op: &str, e: &SdkError<E, R>) -> ObjectError
where
    E: std::error::Error + 'static,
    R: fmt::Debug,
{
    ObjectError::Unavailable(format!("S3 {op}: {}", DisplayErrorContext(e)))
}
