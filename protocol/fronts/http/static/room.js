// The waiting page's script (protocol/fronts/http/page.py serves it, docs/waiting-room.md
// "The waiting page" shows it).  No framework, no build step: the page's CSP runs this
// file and nothing inline.
//
// The server chose the words (data-strings, in the visitor's language) and names the
// function (data-function).  The script keeps the visitor's task, its uniqueId and token,
// in localStorage under "zstalk.room.<function>": a reload, or the page opened again,
// takes that place back instead of joining at the end.  It follows the task's event
// stream (GET /v1/tasks/{id}/events) with fetch() and a ReadableStream, since EventSource
// cannot send Authorization: Bearer, and parses Server-Sent Events itself (WHATWG HTML
// section 9.2.6, "Interpreting an event stream": lines end in CR LF, LF or CR; a blank
// line dispatches; "event", "data", "id", "retry"; a line starting with ":" is a
// comment).  A stream that breaks is opened again after the server's `retry` (or longer,
// doubling up to MAX_BACKOFF_MS, with jitter, while it keeps failing), with the last
// event's id as Last-Event-ID, so the stream resumes where it was.
//
//   place     the place: "ahead of you" (waitNum) in the live region, the time left
//             (waitTime, ms) beside it; a pre-line (opensAt) or a closed line instead
//   admitted  off to admitUrl, which carries the pass in its fragment
//   end       the place is gone (cancelled, expired): the visitor may join again
//
// Leave cancels the task with its token (DELETE /v1/tasks/{id}); closing the tab does
// not, so the place stays until online_heartbeat runs out (the page says so).
"use strict";

(function () {
  const MAX_BACKOFF_MS = 30000;
  const root = document.getElementById("zstalk-room");
  if (!root) {
    return;
  }
  const fn = root.dataset.function;
  const words = JSON.parse(root.dataset.strings);
  const lang = root.lang || "en";
  const statusEl = document.getElementById("room-status");
  const timeEl = document.getElementById("room-time");
  const leaveButton = document.getElementById("room-leave");
  const joinButton = document.getElementById("room-join");
  const storageKey = "zstalk.room." + fn;
  const tasks = "/v1/tasks";

  let visit = load();       // {id, token} of the visitor's task, or null
  let lastEventId = "";
  let retryMs = 2000;       // the stream's `retry`
  let backoffMs = 0;        // grows while reconnecting fails
  let controller = null;    // aborts the stream being read
  let finished = false;     // admitted, ended or left: no more reconnecting
  let lastPlace = null;     // shown again when a stream resumes (it sends no news if none)

  function fill(text, values) {
    return text.replace(/\{(\w+)\}/g,
                        (whole, name) => (name in values ? String(values[name]) : whole));
  }

  function say(text, time) {
    if (statusEl.textContent !== text) {
      statusEl.textContent = text;      // (the live region: read out when it changes)
    }
    timeEl.textContent = time || "";
  }

  function load() {
    try {
      const kept = JSON.parse(localStorage.getItem(storageKey));
      return kept && kept.id && kept.token ? kept : null;
    } catch (error) {
      return null;
    }
  }

  function keep(kept) {
    try {
      localStorage.setItem(storageKey, JSON.stringify(kept));
    } catch (error) {
      // (storage off: the place lasts as long as the page)
    }
  }

  function forget() {
    try {
      localStorage.removeItem(storageKey);
    } catch (error) {
      // (as in keep)
    }
    visit = null;
    lastEventId = "";
    lastPlace = null;
  }

  function duration(ms) {
    const seconds = Math.max(0, Math.round(ms / 1000));
    return seconds < 120 ? fill(words.seconds, {s: seconds})
                         : fill(words.minutes, {m: Math.round(seconds / 60)});
  }

  function when(instant) {
    const date = new Date(instant);
    return isNaN(date) ? String(instant)
                       : date.toLocaleString(lang, {dateStyle: "medium", timeStyle: "short"});
  }

  function showPlace(place) {
    lastPlace = place;
    if (place.phase === "pre-line") {
      say(fill(words.preline, {at: when(place.opensAt)}));
      return;
    }
    const ahead = place.waitNum === undefined ? "" : fill(words.place, {n: place.waitNum});
    if (place.phase === "closed") {
      say([ahead, words.closed].filter(Boolean).join(". "));
      return;
    }
    const time = place.waitTime === undefined ? words.timeUnknown
                                              : fill(words.time, {t: duration(place.waitTime)});
    say(ahead || words.joining, time);
  }

  function admitted(data) {
    stop();
    leaveButton.hidden = true;
    if (data.admitUrl) {
      say(words.admitted);
      window.location.assign(data.admitUrl);
    } else {
      say(words.admittedHere);
    }
  }

  function ended(data) {
    stop();
    forget();
    say(fill(words.ended, {status: data.status || ""}));
    leaveButton.hidden = true;
    joinButton.hidden = false;
  }

  function stop() {
    finished = true;
    if (controller) {
      controller.abort();
    }
  }

  function dispatch(event) {
    if (event.id !== null) {
      lastEventId = event.id;
    }
    if (!event.data.length) {
      return;
    }
    let data;
    try {
      data = JSON.parse(event.data.join("\n"));
    } catch (error) {
      return;
    }
    if (event.type === "place") {
      showPlace(data);
    } else if (event.type === "admitted") {
      admitted(data);
    } else if (event.type === "end") {
      ended(data);
    }
  }

  // One stream's bytes as events: `parser.feed(text)` for each chunk decoded.
  function eventParser() {
    let buffer = "";
    let event = {type: "message", data: [], id: null};
    function line(text) {
      if (text === "") {
        dispatch(event);
        event = {type: "message", data: [], id: null};
        return;
      }
      if (text[0] === ":") {
        return;
      }
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value[0] === " ") {
        value = value.slice(1);
      }
      if (field === "event") {
        event.type = value;
      } else if (field === "data") {
        event.data.push(value);
      } else if (field === "id" && value.indexOf("\0") < 0) {
        event.id = value;
      } else if (field === "retry" && /^\d+$/.test(value)) {
        retryMs = Number(value);
      }
    }
    return {
      feed(text) {
        buffer += text;
        let end;
        while (!finished && (end = /\r\n|\r|\n/.exec(buffer)) !== null) {
          if (end[0] === "\r" && end.index === buffer.length - 1) {
            break;      // (a CR last may be half of a CR LF: wait for the next chunk)
          }
          line(buffer.slice(0, end.index));
          buffer = buffer.slice(end.index + end[0].length);
        }
      },
    };
  }

  async function follow() {
    finished = false;
    leaveButton.hidden = false;
    joinButton.hidden = true;
    controller = new AbortController();
    const headers = {Authorization: "Bearer " + visit.token, Accept: "text/event-stream"};
    if (lastEventId) {
      headers["Last-Event-ID"] = lastEventId;
    }
    let response;
    try {
      response = await fetch(tasks + "/" + encodeURIComponent(visit.id) + "/events",
                             {headers: headers, signal: controller.signal, cache: "no-store"});
    } catch (error) {
      return reconnect();
    }
    if ([401, 403, 404].includes(response.status)) {
      forget();         // (that place is gone: long ended, or not this token's)
      return join();
    }
    if (!response.ok) {
      return reconnect(Number(response.headers.get("Retry-After")) * 1000 || 0);
    }
    backoffMs = 0;
    if (lastPlace) {
      showPlace(lastPlace);     // (away with "connection lost": the stream is back)
    }
    const parser = eventParser();
    const decoder = new TextDecoder();
    const reader = response.body.getReader();
    try {
      for (;;) {
        const chunk = await reader.read();
        if (chunk.done || finished) {
          break;
        }
        parser.feed(decoder.decode(chunk.value, {stream: true}));
      }
    } catch (error) {
      // (the stream broke, or was aborted: reconnect says which)
    }
    reconnect();
  }

  function reconnect(atLeastMs) {
    if (finished || !visit) {
      return;
    }
    timeEl.textContent = words.lost;
    backoffMs = Math.min(MAX_BACKOFF_MS, backoffMs ? backoffMs * 2 : retryMs);
    const wait = Math.max(atLeastMs || 0, backoffMs * (0.5 + Math.random() / 2));
    window.setTimeout(follow, wait);
  }

  async function join() {
    finished = false;
    joinButton.hidden = true;
    say(words.joining);
    let response;
    let body = {};
    try {
      response = await fetch(tasks, {method: "POST", headers: {"Content-Type": "application/json"},
                                     body: JSON.stringify({function: fn, type: "online"})});
      body = await response.json();
    } catch (error) {
      response = response || {status: 0, headers: new Headers()};
    }
    if (response.status !== 201) {
      say(fill(words.refused, {message: body.message || response.status || words.lost}));
      joinButton.hidden = false;
      return;
    }
    visit = {id: body.uniqueId, token: body.token};
    keep(visit);
    showPlace(body);
    follow();
  }

  async function leave() {
    leaveButton.disabled = true;
    stop();
    const leaving = visit;
    try {
      await fetch(tasks + "/" + encodeURIComponent(leaving.id),
                  {method: "DELETE", headers: {Authorization: "Bearer " + leaving.token}});
    } catch (error) {
      // (not heard: the place goes after online_heartbeat all the same)
    }
    forget();
    say(words.left);
    leaveButton.hidden = true;
    leaveButton.disabled = false;
    joinButton.hidden = false;
  }

  leaveButton.addEventListener("click", leave);
  joinButton.addEventListener("click", join);
  if (visit) {
    follow();
  } else {
    join();
  }
}());
