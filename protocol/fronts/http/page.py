"""The waiting page (issue 48): `GET /room/{function}` serves a page where a visitor of a
room the public may join waits for their turn, and `/room/static/` its script and style.

The broker tells the front which functions have a page (Settings.rooms: those whose
`online` is "public" or "only", with their `room_template` as the broker read it, at
start and on SIGHUP, and their online_heartbeat); any other name is a 404 in the API's
JSON.  The page is the template with its one `{{ room }}` replaced by the room's markup
(`room_markup`), or the built-in page (`BUILT_IN`) around it.  Everything the page says
is chosen here, in the visitor's language (English or German, by Accept-Language,
RFC 9110 section 12.5.4: `language`), and handed to the script as data attributes of the
room's element: the page runs no inline script and no inline style, so its
Content-Security-Policy (`CSP`) allows none (W3C CSP Level 3; no 'unsafe-inline').

The script (static/room.js) does the rest in the browser: it joins the line (POST
/v1/tasks, type online) or takes its place back from the uniqueId and token it kept in
localStorage, follows the task's event stream with fetch() (which can send `Authorization:
Bearer`, where EventSource cannot), resuming with Last-Event-ID, and goes to admitUrl
when admitted.  The static files are read once, and named with a version query (a digest
of both), so they can be cached for a year: a new release is a new URL.

    GET /room/{function}          the page: text/html, CSP, no-store, Vary: Accept-Language
    GET /room/static/{room.js,room.css}    Cache-Control: public, max-age=31536000, immutable
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from importlib import resources
from typing import NamedTuple

from aiohttp import web

from .api import Problem, refuse

#: the page's policy: its own script, style and API, images inline at most, no framing
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; frame-ancestors 'none'")
PLACEHOLDER = "{{ room }}"          # (broker/config_file.py checks a template has it once)
STATIC = {"room.js": "text/javascript; charset=utf-8", "room.css": "text/css; charset=utf-8"}
STATIC_CACHE = "public, max-age=31536000, immutable"
LANGUAGES = ("en", "de")            # the first is the default

#: what the page says, by language; {n} (waitNum: those ahead), {t}, {at}, {status} and
#: {message} are the script's to fill, {heartbeat} is filled here
STRINGS = {
    "en": {
        "title": "Waiting room",
        "joining": "Joining the line…",
        "place": "Ahead of you in line: {n}",
        "time": "Time left: about {t}",
        "timeUnknown": "Time left: not known yet",
        "preline": "The line opens at {at}. Everyone who joins before then gets a place "
                   "in a random draw at the opening.",
        "closed": "The line is closed for now: nobody is admitted. Keep this page open to "
                  "keep your place.",
        "admitted": "It is your turn. Taking you there…",
        "admittedHere": "It is your turn.",
        "ended": "You are no longer in line ({status}).",
        "left": "You left the line.",
        "refused": "You could not join the line: {message}",
        "lost": "The connection was lost; trying again…",
        "leave": "Leave the line",
        "join": "Join the line",
        "keepOpen": "Keep this page open. If you close it, your place is kept for "
                    "{heartbeat}, then it goes to the next in line; to give it up now, "
                    "leave the line.",
        "minutes": "{m} min", "seconds": "{s} s",
        "noScript": "This page needs JavaScript to keep your place in line.",
    },
    "de": {
        "title": "Warteraum",
        "joining": "Sie werden eingereiht …",
        "place": "Vor Ihnen in der Schlange: {n}",
        "time": "Verbleibende Zeit: etwa {t}",
        "timeUnknown": "Verbleibende Zeit: noch unbekannt",
        "preline": "Die Schlange öffnet um {at}. Wer vorher kommt, erhält seinen Platz bei "
                   "der Öffnung durch Los.",
        "closed": "Die Schlange ist vorerst geschlossen: niemand wird eingelassen. Lassen "
                  "Sie diese Seite offen, um Ihren Platz zu behalten.",
        "admitted": "Sie sind an der Reihe. Sie werden weitergeleitet …",
        "admittedHere": "Sie sind an der Reihe.",
        "ended": "Sie sind nicht mehr in der Schlange ({status}).",
        "left": "Sie haben die Schlange verlassen.",
        "refused": "Sie konnten nicht eingereiht werden: {message}",
        "lost": "Die Verbindung ist unterbrochen; neuer Versuch …",
        "leave": "Schlange verlassen",
        "join": "Einreihen",
        "keepOpen": "Lassen Sie diese Seite offen. Schließen Sie sie, bleibt Ihr Platz "
                    "noch {heartbeat} erhalten und geht dann an den Nächsten; um ihn gleich "
                    "freizugeben, verlassen Sie die Schlange.",
        "minutes": "{m} Min.", "seconds": "{s} Sek.",
        "noScript": "Diese Seite braucht JavaScript, um Ihren Platz zu halten.",
    },
}

BUILT_IN = ('<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<title>{title}</title>\n<link rel="icon" href="data:,">\n</head>\n<body>\n'
            + PLACEHOLDER + '\n</body>\n</html>\n')
_QUALITY = re.compile(r"^\s*q\s*=\s*([01](?:\.\d{0,3})?)\s*$", re.I)


class Static(NamedTuple):
    body: bytes
    content_type: str


def language(accept_language: str) -> str:
    """The visitor's language of LANGUAGES, by Accept-Language's weights (RFC 9110
    section 12.5.4: "de-AT;q=0.9" counts for "de"; q=0 is "not this one"); the first
    of LANGUAGES when none is asked for."""
    best, best_q = LANGUAGES[0], 0.0
    for position, item in enumerate(accept_language.split(",")[:32]):
        tag, *params = item.split(";")
        primary = tag.strip().lower().split("-")[0]
        q = 1.0
        for param in params:
            match = _QUALITY.match(param)
            if match:
                q = float(match[1])
        if primary in LANGUAGES and q > best_q:
            best, best_q = primary, q
    return best


def duration_text(ms: int, lang: str) -> str:
    """A duration as the page says it: whole minutes, or seconds under two minutes."""
    words = STRINGS[lang]
    seconds = max(0, round(ms / 1000))
    if seconds < 120:
        return words["seconds"].format(s=seconds)
    return words["minutes"].format(m=round(seconds / 60))


def room_markup(function: str, lang: str, heartbeat_ms: int, version: str) -> str:
    """What `{{ room }}` becomes: the style, the room's element with the words the script
    shows (data-strings) and one live region for the place, and the script."""
    words = {**STRINGS[lang], "keepOpen": STRINGS[lang]["keepOpen"].format(
        heartbeat=duration_text(heartbeat_ms, lang))}
    e = html.escape
    return (f'<link rel="stylesheet" href="/room/static/room.css?v={version}">\n'
            f'<main id="zstalk-room" class="zstalk-room" lang="{lang}" '
            f'data-function="{e(function)}" data-strings="{e(json.dumps(words))}">\n'
            f'<h1>{e(words["title"])}</h1>\n'
            # the place and its news: read out when they change, politely (WAI-ARIA 1.2)
            f'<p id="room-status" role="status" aria-live="polite" aria-atomic="true">'
            f'{e(words["joining"])}</p>\n'
            f'<p id="room-time"></p>\n'
            f'<p id="room-note">{e(words["keepOpen"])}</p>\n'
            f'<button id="room-leave" type="button" hidden>{e(words["leave"])}</button>\n'
            f'<button id="room-join" type="button" hidden>{e(words["join"])}</button>\n'
            f'<noscript><p>{e(words["noScript"])}</p></noscript>\n'
            f'</main>\n'
            f'<script src="/room/static/room.js?v={version}" defer></script>')


def room_of(rooms: dict, function: str) -> list | None:
    """[template, heartbeat ms] of the function's page (a name under base_url takes
    the "" entry), or None: the public may not join it here."""
    return rooms.get(function) or (rooms.get("") if function else None)


class Pages:
    """The static files (read once) and the pages made from Settings.rooms."""

    def __init__(self) -> None:
        folder = resources.files(__package__).joinpath("static")
        self.static = {name: Static(folder.joinpath(name).read_bytes(), kind)
                       for name, kind in STATIC.items()}
        digest = hashlib.sha256(b"".join(f.body for f in self.static.values()))
        self.version = digest.hexdigest()[:12]

    def response(self, rooms: dict, request: web.Request) -> web.Response | Problem:
        """GET /room/{function}: the page, under its CSP, never cached (its words follow
        Accept-Language, its template SIGHUP); or the 404."""
        made = self.page(rooms, request.match_info["function"],
                         request.headers.get("Accept-Language", ""))
        if isinstance(made, Problem):
            return made
        text, lang = made
        return web.Response(text=text, content_type="text/html", headers={
            "Content-Security-Policy": CSP, "Cache-Control": "no-store",
            "Content-Language": lang, "Vary": "Accept-Language",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    def static_response(self, request: web.Request) -> web.Response | Problem:
        """GET /room/static/{name}: room.js or room.css, cached for a year (the page names
        them with the version query of these very bytes)."""
        found = self.static.get(request.match_info["name"])
        if found is None:
            return refuse(404, f"no such resource: {request.path}")
        return web.Response(body=found.body, headers={
            "Content-Type": found.content_type, "Cache-Control": STATIC_CACHE,
            "X-Content-Type-Options": "nosniff"})

    def page(self, rooms: dict, function: str, accept_language: str) -> tuple[str, str] | Problem:
        """(the page's HTML, its language), or the 404 of a function without one."""
        room = room_of(rooms, function)
        if room is None:
            return refuse(404, f"no waiting page for {function!r}: the public may not join "
                               "its line (online \"public\" or \"only\")")
        template, heartbeat_ms = room
        lang = language(accept_language)
        if not template:
            template = BUILT_IN.replace("{lang}", lang).replace(
                "{title}", html.escape(STRINGS[lang]["title"]))
        markup = room_markup(function, lang, heartbeat_ms, self.version)
        return template.replace(PLACEHOLDER, markup, 1), lang
