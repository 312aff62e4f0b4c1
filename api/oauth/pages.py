"""The few HTML pages a person sees while connecting an account: small, readable, and inert.

No page ever shows a token, code, state or flow handle, loads anything from elsewhere, runs script or
may be framed. Every response from the browser routes (pages and redirects) carries the same headers:
``Cache-Control: no-store``, ``X-Frame-Options: DENY`` plus CSP ``frame-ancestors 'none'`` (no
clickjacking), ``Referrer-Policy: no-referrer`` (a callback URL's query never leaks onward), and
``X-Content-Type-Options: nosniff``.
"""

from html import escape

from litestar import Response
from litestar.datastructures import Cookie
from litestar.enums import MediaType

SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Pragma": "no-cache",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:1.05rem;line-height:1.5;color:#1b1b1b;
background:#f6f6f4;margin:0}
main{max-width:34rem;margin:4rem auto;padding:2rem 2.25rem;background:#fff;border-radius:10px;
box-shadow:0 1px 4px rgba(0,0,0,.12)}
h1{font-size:1.6rem;margin:0 0 1rem}
.tone{font-size:.85rem;font-weight:600;letter-spacing:.04em;text-transform:uppercase;margin:0 0 .5rem}
.ok .tone{color:#1a7f37}.warn .tone{color:#9a6700}.err .tone{color:#b42318}
p{margin:.6rem 0}button{font:inherit;padding:.45rem 1.1rem;margin-top:.6rem}
footer{margin-top:1.5rem;font-size:.85rem;color:#5f5f5f}
"""

_TONES = {"ok": "Done", "warn": "Not completed", "err": "Stopped"}


def page(
    title: str,
    paragraphs: list[str],
    *,
    status: int,
    tone: str = "err",
    form: tuple[str, dict[str, str], str] | None = None,
    form_redirects_to: str | None = None,
    cookies: list[Cookie] | None = None,
) -> Response[str]:
    """A complete HTML page; every string is escaped here, so callers pass plain text.

    ``form`` is ``(action path, hidden fields, button label)``: a same-origin POST form (the page's CSP then
    allows ``form-action 'self'`` and its referrer policy is ``same-origin``; the page has no secret URL).
    ``form_redirects_to`` is an origin the form's answer may redirect the browser to: browsers apply
    ``form-action`` to every redirect of a form submission, so it must be listed there too.
    """
    body = "\n".join(f"<p>{escape(text)}</p>" for text in paragraphs)
    headers = SECURITY_HEADERS
    referrer = "no-referrer"
    if form is not None:
        action, fields, label = form
        hidden = "".join(
            f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">' for name, value in fields.items()
        )
        body += (
            f'\n<form method="post" action="{escape(action)}">{hidden}'
            f'<button type="submit">{escape(label)}</button></form>'
        )
        targets = "'self'" if form_redirects_to is None else f"'self' {form_redirects_to}"
        policy = SECURITY_HEADERS["Content-Security-Policy"].replace("form-action 'none'", f"form-action {targets}")
        # Under no-referrer a browser sends "Origin: null" with the form; same-origin keeps it checkable.
        referrer = "same-origin"
        headers = {**SECURITY_HEADERS, "Content-Security-Policy": policy, "Referrer-Policy": referrer}
    html = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="{referrer}">
<title>{escape(title)} · Coatcheck</title>
<style>{_STYLE}</style>
</head>
<body>
<main class="{escape(tone)}">
<p class="tone">{escape(_TONES.get(tone, ""))}</p>
<h1>{escape(title)}</h1>
{body}
<footer>Coatcheck · connected accounts</footer>
</main>
</body>
</html>
"""
    return Response(html, status_code=status, media_type=MediaType.HTML, headers=headers, cookies=cookies or [])


def redirect(location: str, *, cookies: list[Cookie] | None = None) -> Response[str]:
    """A 303 to ``location`` with the same protective headers as a page."""
    return Response(
        "",
        status_code=303,
        media_type=MediaType.TEXT,
        headers={**SECURITY_HEADERS, "Location": location},
        cookies=cookies or [],
    )


def connected(provider_label: str) -> Response[str]:
    return page(
        "Connected — return to your assistant",
        [
            f"Your {provider_label} account is now connected to Coatcheck.",
            "Your assistant will carry on with what it was doing. You can close this tab.",
        ],
        status=200,
        tone="ok",
    )


def not_found() -> Response[str]:
    return page(
        "This connect link is not valid",
        [
            "The link is unknown, has expired, or was already used.",
            "Go back to your assistant and ask it again; it will give you a fresh link.",
        ],
        status=404,
        tone="warn",
    )


def wrong_user() -> Response[str]:
    return page(
        "This link belongs to someone else",
        [
            "You are signed in as a different user than the one who asked to connect this account, "
            "so nothing was connected.",
            "If someone sent you this link, do not use it. If it is yours, sign in as the user your "
            "assistant uses and open the link again.",
        ],
        status=403,
    )


def bad_callback(reason: str) -> Response[str]:
    return page(
        "This sign-in response cannot be used",
        [reason, "Go back to your assistant and ask it again; it will give you a fresh link."],
        status=400,
    )


def denied(provider_label: str) -> Response[str]:
    return page(
        f"{provider_label} was not connected",
        [
            f"{provider_label} reported that access was not granted, so nothing was connected.",
            "If that was a mistake, go back to your assistant and ask it again.",
        ],
        status=403,
        tone="warn",
    )


def failed(provider_label: str) -> Response[str]:
    return page(
        f"Connecting {provider_label} failed",
        [
            f"Coatcheck could not complete the sign-in with {provider_label}, so nothing was connected.",
            "Go back to your assistant and ask it again to get a fresh link.",
        ],
        status=400,
    )


def login_failed(*, cancelled: bool = False) -> Response[str]:
    """The end of a sign-in that did not say who the user is; ``cancelled`` when the user said no upstream."""
    first = (
        "You cancelled the sign-in at the identity provider, so Coatcheck does not know who you are and nothing "
        "was connected or authorised."
        if cancelled
        else "Coatcheck could not confirm who you are, so nothing was connected."
    )
    return page("Sign-in did not complete", [first, "Open the link from your assistant again to retry."], status=400)


def signout_form(subject: str, action: str, token: str, *, issuer: str, issuer_signout: str | None) -> Response[str]:
    """The sign-out button; ``issuer_signout`` is the origin of the issuer's end-session endpoint, if it has one."""
    if issuer_signout is not None:
        then = f"Signing out here ends that, then takes you to {issuer} to sign out there as well."
    else:
        then = f"Signing out here ends that; your account at {issuer} stays signed in there."
    return page(
        "Sign out of Coatcheck",
        [f"This browser is signed in to Coatcheck as {subject}, to connect accounts.", then],
        status=200,
        tone="warn",
        form=(action, {"token": token}, "Sign out"),
        form_redirects_to=issuer_signout,
    )


def signed_out(cookies: list[Cookie], *, issuer: str, issuer_signout: bool) -> Response[str]:
    """The end of a sign-out; without ``issuer_signout`` the issuer's own session was left alone."""
    if issuer_signout:
        paragraphs = [
            "This browser is no longer signed in to Coatcheck.",
            # The issuer returns here whether or not the person confirmed there, so say what each means.
            f"If you confirmed signing out at {issuer}, the next connect link starts with signing in there; "
            f"if you chose to stay signed in at {issuer}, close the browser on a shared computer.",
        ]
    else:
        paragraphs = [
            f"You are signed out of Coatcheck; your account at {issuer} may still be signed in.",
            f"On a shared computer, sign out at {issuer} too or close the browser: otherwise the next connect "
            "link may sign in as you again without asking.",
        ]
    return page("Signed out", paragraphs, status=200, tone="ok", cookies=cookies)


def signout_refused() -> Response[str]:
    return page(
        "Sign-out refused",
        [
            "This request did not come from Coatcheck's own sign-out page, so nothing was changed.",
            "Open the sign-out page of Coatcheck and use its button.",
        ],
        status=403,
    )
