//! An in-test OTLP profiles collector (gRPC, gzip accepted) that keeps every
//! request, the checks every export must pass, and readers of what it kept:
//! resource attributes, sampled pids, each sample's locations and names.
use std::sync::{Arc, Mutex};

use hostprof::profile::dictionary_violations;
use hostprof_proto::{
    collector::{
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
        profiles_service_server::{ProfilesService, ProfilesServiceServer},
    },
    common::any_value::Value,
    profiles::{Location, ProfilesDictionary, ResourceProfiles, Sample},
};
use tokio::net::TcpListener;
use tonic::codec::CompressionEncoding;

/// An OTLP collector that keeps what it receives.
#[derive(Clone, Default)]
pub struct Collector {
    requests: Arc<Mutex<Vec<ExportProfilesServiceRequest>>>,
}

#[tonic::async_trait]
impl ProfilesService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        self.requests.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

impl Collector {
    pub fn requests(&self) -> Vec<ExportProfilesServiceRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// Serves on `listener` until the returned task is aborted.
    pub fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let service =
            ProfilesServiceServer::new(self.clone()).accept_compressed(CompressionEncoding::Gzip);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("serve");
        })
    }
}

/// Asserts every dictionary rule, and the CPU profile shape, on each request.
pub fn assert_valid(requests: &[ExportProfilesServiceRequest]) {
    assert!(!requests.is_empty(), "the collector received nothing");
    for (at, request) in requests.iter().enumerate() {
        let dictionary = request.dictionary.as_ref().expect("a dictionary");
        let problems = dictionary_violations(dictionary, &request.resource_profiles);
        assert!(problems.is_empty(), "request {at}: {problems:#?}");
        for group in &request.resource_profiles {
            let profile = &group.scope_profiles[0].profiles[0];
            let strings = &dictionary.string_table;
            let sample_type = profile.sample_type.expect("sample_type");
            assert_eq!(strings[sample_type.type_strindex as usize], "samples");
            let period_type = profile.period_type.expect("period_type");
            assert_eq!(strings[period_type.unit_strindex as usize], "nanoseconds");
            assert_eq!(profile.period, 1_000_000_000 / 19);
            assert!(
                profile
                    .samples
                    .iter()
                    .all(|s| !s.timestamps_unix_nano.is_empty())
            );
        }
    }
}

/// A string attribute of a resource.
pub fn resource_string(group: &ResourceProfiles, key: &str) -> Option<String> {
    group
        .resource
        .as_ref()?
        .attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(text) => Some(text.clone()),
            _ => None,
        })
}

/// The value of `sample`'s attribute `key`, if it has one.
pub fn sample_attribute<'a>(
    dictionary: &'a ProfilesDictionary,
    sample: &Sample,
    key: &str,
) -> Option<&'a Value> {
    sample.attribute_indices.iter().find_map(|&index| {
        let attribute = &dictionary.attribute_table[index as usize];
        (dictionary.string_table[attribute.key_strindex as usize] == key)
            .then(|| attribute.value.as_ref()?.value.as_ref())
            .flatten()
    })
}

/// `sample`'s attribute `key`, if it has one with a string value.
pub fn text_attribute(
    dictionary: &ProfilesDictionary,
    sample: &Sample,
    key: &str,
) -> Option<String> {
    match sample_attribute(dictionary, sample, key)? {
        Value::StringValue(value) => Some(value.clone()),
        _ => None,
    }
}

/// `sample`'s attribute `key`, if it has one with an integer value.
pub fn int_attribute(dictionary: &ProfilesDictionary, sample: &Sample, key: &str) -> Option<i64> {
    match sample_attribute(dictionary, sample, key)? {
        Value::IntValue(value) => Some(*value),
        _ => None,
    }
}

/// The `process.pid` of a sample, if it has one.
pub fn sample_pid(dictionary: &ProfilesDictionary, sample: &Sample) -> Option<i64> {
    int_attribute(dictionary, sample, "process.pid")
}

/// Pids with samples in `group`.
pub fn sampled_pids(dictionary: &ProfilesDictionary, group: &ResourceProfiles) -> Vec<i64> {
    group.scope_profiles[0].profiles[0]
        .samples
        .iter()
        .filter_map(|sample| sample_pid(dictionary, sample))
        .collect()
}

/// A sample's locations, leaf first.
pub fn sample_locations<'a>(
    dictionary: &'a ProfilesDictionary,
    sample: &Sample,
) -> Vec<&'a Location> {
    dictionary.stack_table[sample.stack_index as usize]
        .location_indices
        .iter()
        .map(|&location| &dictionary.location_table[location as usize])
        .collect()
}

/// The function names of a location: inlined functions first, as its lines
/// list them; none when the agent sent it unsymbolized.
pub fn location_names(dictionary: &ProfilesDictionary, location: &Location) -> Vec<String> {
    location
        .lines
        .iter()
        .map(|line| {
            let function = &dictionary.function_table[line.function_index as usize];
            dictionary.string_table[function.name_strindex as usize].clone()
        })
        .collect()
}

/// The function names of a sample's stack, leaf first (a location's
/// inlined functions before it, as [`location_names`]).
pub fn sample_functions(dictionary: &ProfilesDictionary, sample: &Sample) -> Vec<String> {
    sample_locations(dictionary, sample)
        .into_iter()
        .flat_map(|location| location_names(dictionary, location))
        .collect()
}

/// A sample's count: its value, or one per timestamp when it has none.
pub fn sample_count(sample: &Sample) -> u64 {
    match sample.values.first() {
        Some(&value) => value as u64,
        None => sample.timestamps_unix_nano.len() as u64,
    }
}
