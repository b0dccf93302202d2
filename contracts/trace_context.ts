/**
 * W3C Trace Context's `traceparent` header, read as the recommendation
 * (level 1, §3.2 and §4.3) tells a receiver to: the one rule every part of
 * poimen applies to a traceparent it is given (the API to a request's, the
 * relay to a dispatch message's, the dispatch client to its caller's, the
 * worker to a stored run's). Depends on nothing.
 *
 * @module
 */

// version-traceid-parentid-flags, lower-case hex; a version after 00 may
// append fields after a dash (printable ASCII: it goes into a header).
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?$/;

/**
 * Whether `value` is a valid W3C `traceparent`: exactly as sent (not
 * trimmed or lower-cased: a receiver must not repair one), lower-case hex
 * fields, a version other than `ff`, trace and parent ids not all zeros,
 * and nothing after the flags on version `00` (a later version may add
 * fields after a dash).
 */
export function isTraceparent(value: string): boolean {
  const m = TRACEPARENT.exec(value);
  if (!m || m[1] === "ff" || (m[1] === "00" && m[4] !== undefined)) return false;
  return !/^0+$/.test(m[2]) && !/^0+$/.test(m[3]);
}
