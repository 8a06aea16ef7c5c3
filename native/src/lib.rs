//! `dwell_native.plan`: admission's `Planner.plan` for the common request, decided
//! straight from the request's JSON; `dwell_native.answer`: its HTTP answer.
//!
//! The Python plan (`dwell.admission.plan`) is the reference: this module builds the
//! same records, results and answer heads, and asks Python for every decision
//! (`decide`, which calls `dwell.core.admit.admit`), once per distinct ask in a
//! request. It only takes the request whose every message is published or rejected by
//! the rule: a body that does not fit the schema (unknown fields are ignored, as there),
//! or a message that errs on its own (bad base64, a payload over the limit, a reserved
//! property name, a repeated one, an `eventTime` string that is not a plain number),
//! makes it return None, and the caller goes the Python way, which words the error. A
//! property test holds the two to the same output on generated requests
//! (tests/unit/admission/test_native.py).
//!
//! What it saves is the interpreter: decoding into message structs and then walking
//! them in Python cost ~80 us of a 100-message request, ~20% of admission's CPU.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::Write;

use base64::Engine;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// Java's Long.MAX_VALUE: the largest time or id a request may carry.
const MAX_LONG: u64 = i64::MAX as u64;
const RESERVED_PREFIX: &str = "dwell-";
/// The deepest nesting of arrays and objects `plan` parses. sonic-rs recurses once per
/// level, so a small body nested deep enough (`[` x 100,000) would overflow the thread's
/// stack and take the process down; a publish request nests 4 levels.
const MAX_DEPTH: usize = 128;

/// Pulsar's fields that dwell reads for their type only (as `schema.py` types them), so
/// that a body the Python schema refuses is refused here too; unknown fields are skipped.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, deserialize_with = "messages")]
    messages: Vec<Message<'a>>,
    #[serde(default, borrow, rename = "producerName")]
    producer_name: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "payloadEncoding")]
    payload_encoding: Option<Cow<'a, str>>,
    #[serde(default, rename = "schemaVersion")]
    _schema_version: Option<i64>,
    #[serde(default, borrow, rename = "keySchema")]
    _key_schema: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "valueSchema")]
    _value_schema: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    payload: Cow<'a, str>,
    #[serde(default, borrow, rename = "payloadEncoding")]
    payload_encoding: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    key: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "properties")]
    properties: Option<PropertyList<'a>>,
    #[serde(default, rename = "eventTime", deserialize_with = "event_time")]
    event_time: Option<u64>,
    #[serde(default, rename = "sequenceId")]
    sequence_id: Option<u64>,
    #[serde(default, rename = "deliverAt")]
    deliver_at: Option<u64>,
    #[serde(default, rename = "deliverAfterMs")]
    deliver_after_ms: Option<u64>,
    #[serde(default, borrow, rename = "context")]
    _context: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "replicationClusters")]
    _replication_clusters: Option<Vec<Str<'a>>>,
    #[serde(default, rename = "disableReplication")]
    _disable_replication: Option<bool>,
    #[serde(default, rename = "schemaVersion")]
    _schema_version: Option<i64>,
    #[serde(default, borrow, rename = "keySchema")]
    _key_schema: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "valueSchema")]
    _value_schema: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "encryptionParam")]
    _encryption_param: Option<Cow<'a, str>>,
    #[serde(default, rename = "compressionType")]
    _compression_type: Option<Compression>,
    #[serde(default, rename = "uncompressedMessageSize")]
    _uncompressed_message_size: Option<i32>,
}

/// org.apache.pulsar.client.api.CompressionType
#[derive(Deserialize)]
enum Compression {
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "LZ4")]
    Lz4,
    #[serde(rename = "ZLIB")]
    Zlib,
    #[serde(rename = "ZSTD")]
    Zstd,
    #[serde(rename = "SNAPPY")]
    Snappy,
}

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Deserialize)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

/// A message's properties, names and values as the body gives them.
type PropertyList<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// `messages` into a vector sized for a typical request at once (JSON says nothing of a
/// list's length up front, and growing it copies every message parsed so far).
fn messages<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Message<'de>>, D::Error> {
    struct Messages;
    impl<'de> Visitor<'de> for Messages {
        type Value = Vec<Message<'de>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of messages")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(128);
            while let Some(m) = seq.next_element()? {
                out.push(m);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Messages)
}

/// `properties` in the order the body gives them (a Python dict keeps that order).
fn properties<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PropertyList<'de>>, D::Error> {
    struct Props;
    impl<'de> Visitor<'de> for Props {
        type Value = Option<PropertyList<'de>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object of strings, or null")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<Str<'de>, Str<'de>>()? {
                out.push((k.0, v.0));
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Props)
}

/// `eventTime`: a number, or Pulsar's string of one ("" being none). A string that is
/// not plain digits fails the parse, and the Python plan words the error.
fn event_time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct EventTime;
    impl<'de> Visitor<'de> for EventTime {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a number, a string of digits, or null")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }
        fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
            Ok(Some(n))
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
            if s.is_empty() {
                return Ok(None);
            }
            if !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(E::custom("eventTime: not a number"));
            }
            s.parse().map(Some).map_err(|_| E::custom("eventTime: past u64"))
        }
    }
    d.deserialize_option(EventTime)
}

/// Why the Python plan must take the request (it raises or words the error).
struct NotCommon;

type Props<'a> = [(Cow<'a, str>, Cow<'a, str>)];

/// Properties the Python plan accepts as they are: no name it reserves (`dwell-`, any
/// case) and none twice (a dict would keep one of them).
fn plain_properties(props: &Props) -> Result<(), NotCommon> {
    for (i, (name, _)) in props.iter().enumerate() {
        // Python lowercases the whole name first: a non-ASCII character in the first six
        // could lowercase into the prefix, so those go the Python way too.
        let head = &name.as_bytes()[..name.len().min(RESERVED_PREFIX.len())];
        if !head.is_ascii() || head.eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()) {
            return Err(NotCommon);
        }
        if props[..i].iter().any(|(other, _)| other == name) {
            return Err(NotCommon);
        }
    }
    Ok(())
}

fn long(v: Option<u64>) -> Result<Option<u64>, NotCommon> {
    match v {
        Some(n) if n > MAX_LONG => Err(NotCommon),
        _ => Ok(v),
    }
}

fn encoding(e: &Option<Cow<str>>) -> Result<Option<bool>, NotCommon> {
    // Some(true): base64; Some(false): utf-8; None: not given.
    match e.as_deref() {
        None => Ok(None),
        Some("base64") => Ok(Some(true)),
        Some("utf-8") => Ok(Some(false)),
        Some(_) => Err(NotCommon),
    }
}

/// `b"%d" % n`, without a heap allocation on the way.
fn decimal<'py>(py: Python<'py>, mut n: u64) -> Bound<'py, PyBytes> {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    PyBytes::new(py, &digits[at..])
}

fn header<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
    value: Bound<'py, PyBytes>,
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, [name.as_any(), value.as_any()])
}

type Asked = (Option<u64>, Option<u64>);

/// A request's decisions by what was asked (deliverAt, deliverAfterMs):
/// searched in order while there are a few, as in most requests, and through a map once
/// there are many (delays that vary from message to message).
struct Decisions<'py> {
    seen: Vec<(Asked, Decided<'py>)>,
    by_ask: HashMap<Asked, usize>,
}

impl<'py> Decisions<'py> {
    const FEW: usize = 8;

    fn find(&self, asked: &Asked) -> Option<usize> {
        if self.seen.len() <= Self::FEW {
            self.seen.iter().position(|(a, _)| a == asked)
        } else {
            self.by_ask.get(asked).copied()
        }
    }

    fn add(&mut self, asked: Asked, decided: Decided<'py>) -> usize {
        self.seen.push((asked, decided));
        if self.seen.len() > Self::FEW {
            if self.by_ask.is_empty() {
                self.by_ask.extend(self.seen.iter().enumerate().map(|(i, (a, _))| (*a, i)));
            } else {
                self.by_ask.insert(asked, self.seen.len() - 1);
            }
        }
        self.seen.len() - 1
    }
}

/// One decision as `Planner.plan` keeps it: the result fields, the delay headers
/// (None: rejected; empty: immediate), whether it counts as an override, the head.
struct Decided<'py> {
    result: Bound<'py, PyDict>,
    delay_headers: Option<Bound<'py, PyTuple>>,
    counts_override: u64,
    head: Bound<'py, PyAny>,
}

/// Plan a publish request from its body, or None when the Python plan must take it.
///
/// `decide(deliver_at, deliver_after_ms)` returns the decision as
/// `Planner` builds it (`Decided`): `(result fields, delay headers or None, 0 or 1, head)`.
/// Returns `(results, sends, index, heads, delayed, rejected, overridden)`: the fields of
/// `Plan` (see dwell.admission.plan) and the counts of delayed records, rejected
/// messages and counted fixed-delay overrides.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn plan<'py>(
    py: Python<'py>,
    body: &[u8],
    decide: &Bound<'py, PyAny>,
    topic_bytes: &Bound<'py, PyBytes>,
    ready_topic: &Bound<'py, PyString>,
    delayed_topic: &Bound<'py, PyString>,
    now: u64,
    max_payload_bytes: usize,
    max_messages: usize,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    if nested_deeper_than(body, MAX_DEPTH) {
        return Ok(None);
    }
    let Ok(req) = sonic_rs::from_slice::<Body>(body) else {
        return Ok(None);
    };
    let with = With {
        decide, topic_bytes, ready_topic, delayed_topic, now, max_payload_bytes, max_messages,
    };
    match build(py, &req, with)? {
        Ok(planned) => Ok(Some(planned)),
        Err(NotCommon) => Ok(None),
    }
}

/// Whether `body` opens more than `max` arrays or objects at once (outside strings): one
/// pass over the bytes, before a parser that recurses sees them.
fn nested_deeper_than(body: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// What `plan` was given besides the body.
#[derive(Clone, Copy)]
struct With<'a, 'py> {
    decide: &'a Bound<'py, PyAny>,
    topic_bytes: &'a Bound<'py, PyBytes>,
    ready_topic: &'a Bound<'py, PyString>,
    delayed_topic: &'a Bound<'py, PyString>,
    now: u64,
    max_payload_bytes: usize,
    max_messages: usize,
}

fn build<'py>(
    py: Python<'py>,
    req: &Body,
    with: With<'_, 'py>,
) -> PyResult<Result<Bound<'py, PyTuple>, NotCommon>> {
    let With {
        decide, topic_bytes, ready_topic, delayed_topic, now, max_payload_bytes, max_messages,
    } = with;
    let n = req.messages.len();
    if n == 0 || n > max_messages {
        return Ok(Err(NotCommon));
    }
    let default_base64 = match encoding(&req.payload_encoding) {
        Ok(e) => e == Some(true),
        Err(e) => return Ok(Err(e)),
    };
    let h_topic = PyString::intern(py, "dwell-topic");
    let h_publish_time = PyString::intern(py, "dwell-publish-time");
    let h_producer = PyString::intern(py, "dwell-producer");
    let h_sequence = PyString::intern(py, "dwell-sequence-id");
    let h_event_time = PyString::intern(py, "dwell-event-time");
    let h_key = PyString::intern(py, "dwell-key");
    let topic_h = PyTuple::new(py, [h_topic.as_any(), topic_bytes.as_any()])?;
    let producer = req.producer_name.as_deref().unwrap_or("");
    let producer_h = header(py, &h_producer, PyBytes::new(py, producer.as_bytes()))?;
    let now_time_h = header(py, &h_publish_time, decimal(py, now))?;
    let now_int = now.into_pyobject(py)?.into_any();

    let results = PyList::empty(py);
    let sends = PyList::empty(py);
    let index = PyList::empty(py);
    let heads = PyList::empty(py);
    let (mut delayed, mut rejected, mut overridden) = (0u64, 0u64, 0u64);
    let mut decisions = Decisions { seen: Vec::new(), by_ask: HashMap::new() };
    // The header tuples of the last properties seen: batches often repeat them.
    let mut last_props: Option<(&Props, Vec<Bound<PyTuple>>)> = None;
    let b64 = base64::engine::general_purpose::STANDARD;

    for (i, m) in req.messages.iter().enumerate() {
        let base64 = match encoding(&m.payload_encoding) {
            Ok(e) => e.unwrap_or(default_base64),
            Err(e) => return Ok(Err(e)),
        };
        let payload: Cow<[u8]> = if base64 {
            match b64.decode(m.payload.as_bytes()) {
                Ok(bytes) => Cow::Owned(bytes),
                Err(_) => return Ok(Err(NotCommon)),
            }
        } else {
            Cow::Borrowed(m.payload.as_bytes())
        };
        if payload.len() > max_payload_bytes {
            return Ok(Err(NotCommon));
        }
        let props_h: &[Bound<PyTuple>] = match m.properties.as_deref() {
            None | Some([]) => &[],
            Some(props) => {
                if last_props.as_ref().is_none_or(|(last, _)| *last != props) {
                    if let Err(e) = plain_properties(props) {
                        return Ok(Err(e));
                    }
                    let mut tuples = Vec::with_capacity(props.len());
                    for (name, value) in props {
                        let name = PyString::new(py, name);
                        tuples.push(header(py, &name, PyBytes::new(py, value.as_bytes()))?);
                    }
                    last_props = Some((props, tuples));
                }
                &last_props.as_ref().expect("just set").1
            }
        };
        // 0 is Pulsar's "not set" for both; deliverAt wins over deliverAfterMs, as there.
        let (deliver_at, deliver_after) = match (long(m.deliver_at), long(m.deliver_after_ms)) {
            (Ok(a), Ok(b)) => {
                let a = a.filter(|&t| t != 0);
                (a, if a.is_some() { None } else { b.filter(|&t| t != 0) })
            }
            _ => return Ok(Err(NotCommon)),
        };
        let (Ok(event_time), Ok(sequence_id)) = (long(m.event_time), long(m.sequence_id)) else {
            return Ok(Err(NotCommon));
        };
        let asked = (deliver_at, deliver_after);
        let at = match decisions.find(&asked) {
            Some(at) => at,
            None => {
                let got = decide.call1(asked)?;
                let got = got.cast::<PyTuple>()?;
                let delay_headers = got.get_item(1)?;
                let d = Decided {
                    result: got.get_item(0)?.cast_into::<PyDict>()?,
                    delay_headers: if delay_headers.is_none() {
                        None
                    } else {
                        Some(delay_headers.cast_into::<PyTuple>()?)
                    },
                    counts_override: got.get_item(2)?.extract()?,
                    head: got.get_item(3)?,
                };
                decisions.add(asked, d)
            }
        };
        let d = &decisions.seen[at].1;
        let Some(delay_headers) = &d.delay_headers else {
            results.append(d.result.copy()?)?;
            rejected += 1;
            continue;
        };
        overridden += d.counts_override;
        // The headers in the Python plan's order, gathered first so that the list is
        // allocated once at its size.
        let mut hs: Vec<Bound<PyTuple>> = Vec::with_capacity(props_h.len() + 8);
        hs.extend(props_h.iter().cloned());
        hs.push(topic_h.clone());
        hs.push(now_time_h.clone());
        hs.push(producer_h.clone());
        if let Some(seq) = sequence_id {
            hs.push(header(py, &h_sequence, decimal(py, seq))?);
        }
        if let Some(t) = event_time.filter(|&t| t != 0) {
            hs.push(header(py, &h_event_time, decimal(py, t))?);
        }
        let time = &now_int;
        let payload = PyBytes::new(py, &payload);
        let key = m.key.as_deref().map(|k| PyBytes::new(py, k.as_bytes()));
        let record = if delay_headers.is_empty() {
            let key = match key {
                Some(k) => k.into_any(),
                None => py.None().into_bound(py),
            };
            let headers = PyList::new(py, hs)?;
            PyTuple::new(py, [
                ready_topic.as_any(), payload.as_any(), &key, headers.as_any(), time,
            ])?
        } else {
            for h in delay_headers.iter() {
                hs.push(h.cast_into::<PyTuple>()?);
            }
            if let Some(k) = key {
                hs.push(header(py, &h_key, k)?);
            }
            delayed += 1;
            let headers = PyList::new(py, hs)?;
            PyTuple::new(py, [
                delayed_topic.as_any(), payload.as_any(), topic_bytes.as_any(),
                headers.as_any(), time,
            ])?
        };
        sends.append(record)?;
        index.append(i)?;
        heads.append(&d.head)?;
        results.append(&d.result)?;
    }
    let out = (results, sends, index, heads, delayed, rejected, overridden);
    Ok(Ok(out.into_pyobject(py)?))
}

/// `Planner.answer` when every message of the plan was accepted: the JSON answer
/// (Pulsar's ProducerAcks), each result its head (`Plan.heads`) and
/// `<partition>:<offset>"}`, then the schemaVersion (`plan.SCHEMA_VERSION`).
#[pyfunction]
fn answer<'py>(
    py: Python<'py>,
    heads: &Bound<'py, PyList>,
    offsets: Vec<(i64, i64)>,
) -> PyResult<Bound<'py, PyBytes>> {
    if heads.len() != offsets.len() {
        return Err(PyValueError::new_err("one offset per head"));
    }
    let mut out = Vec::with_capacity(32 + heads.len() * 128);
    out.extend_from_slice(b"{\"messagePublishResults\":[");
    for (i, (head, (partition, offset))) in heads.iter().zip(offsets).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(head.cast::<PyString>()?.to_str()?.as_bytes());
        write!(out, "{partition}:{offset}\"}}").expect("writing to a Vec");
    }
    out.extend_from_slice(b"],\"schemaVersion\":0}");
    Ok(PyBytes::new(py, &out))
}

#[pymodule]
fn dwell_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(answer, m)?)
}
