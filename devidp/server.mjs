// Coatcheck development identity provider (devidp).
//
// DEVELOPMENT ONLY - NOT FOR PRODUCTION. Anyone can sign in as anyone (no
// passwords), consent is granted automatically, keys and grants live in memory,
// and /dev/* endpoints mint tokens and inject faults.
//
// An OAuth 2.1 / OpenID Connect provider built on panva's oidc-provider. It is
// configured by environment variables only:
//
//   DEVIDP_ISSUER        Issuer URL, scheme://host[:port] with no path, optionally
//                        with a trailing slash (kept as written in `iss` and
//                        discovery, as Auth0 writes its issuer).
//                        Default http://127.0.0.1:9400 (the port is
//                        DEVIDP_PORT if that is set). The listen port comes from
//                        this URL unless DEVIDP_PORT is set.
//   DEVIDP_PORT          Listen port. Overrides the issuer's port, for example
//                        behind a port mapping.
//   DEVIDP_HOST          Bind address. Default 127.0.0.1; use 0.0.0.0 in
//                        containers.
//   DEVIDP_RESOURCES     Comma-separated RFC 8707 resource indicators that may
//                        be requested, e.g. http://localhost:8000/mcp. An access
//                        token for one of them is an RFC 9068 JWT (typ at+jwt)
//                        with aud=<resource>, iss, sub=<username>, iat, exp,
//                        jti, scope and client_id. Matching ignores a trailing
//                        slash and the case of the scheme and host; aud is always
//                        the configured spelling. The first entry is the default
//                        resource for an authorization request that names none.
//                        At the token endpoint, a request without `resource` gets
//                        the JWT for the granted resource unless its scope has
//                        `openid`: then it gets an opaque token for the userinfo
//                        endpoint (oidc-provider's rule), as an OIDC login wants.
//   DEVIDP_SCOPES        Optional extra scopes (space- or comma-separated) to
//                        list in scopes_supported. Always supported: openid
//                        profile email offline_access. Any other scope may be
//                        requested for a resource and is granted as asked.
//   DEVIDP_CLIENTS       Optional JSON array of static clients in RFC 7591
//                        metadata form: client_id, client_secret, redirect_uris,
//                        grant_types, response_types, scope,
//                        token_endpoint_auth_method, ... Defaults: grant_types
//                        authorization_code + refresh_token, response_types code,
//                        token_endpoint_auth_method client_secret_basic. They are
//                        validated at start-up (exit code 2 if invalid).
//   DEVIDP_JWKS_FILE     Optional path to a JSON {"keys":[...]} holding private
//                        JWKs: one RSA key (RS256) and one EC P-256 key (ES256).
//                        If the file does not exist, fresh keys are generated
//                        and written to it (mode 0600), so they survive restarts.
//                        Without this variable, fresh keys are generated at every
//                        start.
//   DEVIDP_ACCESS_TOKEN_ALG   RS256 (default) or ES256, used for JWT access
//                        tokens issued by the real endpoints.
//   DEVIDP_ACCESS_TOKEN_TTL   Access token lifetime in seconds. Default 3600.
//   DEVIDP_ACCESS_TOKEN_FORMAT  "jwt" (default) or "opaque": resource access
//                        tokens from the real endpoints are then opaque strings,
//                        checked at the introspection endpoint (POST /dev/token
//                        still mints JWTs).
//   DEVIDP_REGISTRATION  "0" turns dynamic client registration off (no
//                        registration_endpoint), like Entra or Google: clients
//                        must be in DEVIDP_CLIENTS. Default: on.
//   DEVIDP_SUBJECT_TYPE  "public" (default: sub is the username) or "pairwise":
//                        sub is hex SHA-256 of sector identifier (the redirect
//                        URIs' host) + username + DEVIDP_PAIRWISE_SALT, different
//                        per client host, as Entra does per application.
//   DEVIDP_PAIRWISE_SALT The salt of pairwise subjects. Default: random per start.
//   DEVIDP_PKCE_REQUIRED "all" (default; OAuth 2.1) or "public" (only
//                        token_endpoint_auth_method=none clients). S256 is the
//                        only method.
//   DEVIDP_DEV_TOKENS    "0" removes POST /dev/token. Default: on.
//   DEVIDP_TRUST_PROXY   "1" trusts X-Forwarded-* headers (a TLS-terminating
//                        proxy in front).
//   DEVIDP_RP_LOGOUT     "0" turns off RP-initiated logout (no end_session_endpoint
//                        in discovery), like an IdP without it. Default: on.
//   DEVIDP_LOG           "0" turns off the per-request log line. Default: on.
//                        Tokens, codes, secrets and query strings are never
//                        logged.
//
// Endpoints beyond the standard ones (which discovery lists):
//   GET  /.well-known/openid-configuration and /.well-known/oauth-authorization-server
//   GET  /interaction/:uid           login page (HTML form, field "username")
//   POST /interaction/:uid/login     form submit; signs in, grants consent
//   GET  /session/end                RP-initiated logout: a confirm page ("Yes, sign me out")
//   POST /dev/token                  mint an access token without a browser
//   GET  /dev/health                 200 {"status":"ok"}
//   GET  /dev/stats                  counters; DELETE /dev/stats resets them
//   GET|POST /dev/faults             fault injection: {"token_endpoint": "ok"|"error"|"unavailable"},
//                                    {"authorization_endpoint": "ok"|"deny"|"hold", "client_id": "..."},
//                                    {"token_endpoint_delay_ms": 0..60000} (a slow token endpoint)
// See devidp/README.md for details.

import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as querystring from 'node:querystring';

import * as jose from 'jose';
import Provider, { errors } from 'oidc-provider';

const env = process.env;

function fail(message) {
  console.error(`devidp: ${message}`);
  process.exit(2);
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

const DEFAULT_PORT = 9400;
const ISSUER_AS_WRITTEN = env.DEVIDP_ISSUER || `http://127.0.0.1:${env.DEVIDP_PORT || DEFAULT_PORT}`;
// The issuer is kept as written, one trailing slash included (Auth0's shape); ISSUER_BASE has none and is
// what paths are appended to.
const ISSUER_BASE = ISSUER_AS_WRITTEN.replace(/\/+$/, '');
const ISSUER = ISSUER_AS_WRITTEN.endsWith('/') ? `${ISSUER_BASE}/` : ISSUER_BASE;
let issuerUrl;
try {
  issuerUrl = new URL(ISSUER);
} catch {
  fail('DEVIDP_ISSUER is not a valid URL');
}
if (!['http:', 'https:'].includes(issuerUrl.protocol) || issuerUrl.pathname !== '/' || issuerUrl.search || issuerUrl.hash) {
  fail('DEVIDP_ISSUER must be http(s)://host[:port] with no path, query or fragment');
}
const PORT = Number(env.DEVIDP_PORT || issuerUrl.port || (issuerUrl.protocol === 'https:' ? 443 : 80));
if (!Number.isInteger(PORT) || PORT <= 0 || PORT > 65535) fail('DEVIDP_PORT is not a valid port');
const HOST = env.DEVIDP_HOST || '127.0.0.1';

function splitList(value, separator) {
  return (value || '').split(separator).map((s) => s.trim()).filter(Boolean);
}

function parseUrl(value) {
  try {
    return new URL(value);
  } catch {
    return undefined;
  }
}

function normalizeResource(value) {
  const url = parseUrl(value);
  if (!url) return value;
  let href = url.href; // lower-cases scheme and host
  if (href.endsWith('/') && url.pathname !== '/') href = href.slice(0, -1);
  if (url.pathname === '/' && !value.endsWith('/') && !url.search) href = href.slice(0, -1);
  return href;
}

const RESOURCES = splitList(env.DEVIDP_RESOURCES, ',');
for (const resource of RESOURCES) {
  const url = parseUrl(resource);
  if (!url || url.hash) fail(`DEVIDP_RESOURCES entry is not an absolute URI without fragment: ${resource}`);
}
const RESOURCE_BY_NORMALIZED = new Map(RESOURCES.map((r) => [normalizeResource(r), r]));
function configuredResource(value) {
  if (typeof value !== 'string') return undefined;
  return RESOURCE_BY_NORMALIZED.get(normalizeResource(value));
}

const BASE_SCOPES = ['openid', 'profile', 'email', 'offline_access'];
const EXTRA_SCOPES = splitList(env.DEVIDP_SCOPES, /[\s,]+/);
const SUPPORTED_SCOPES = [...new Set([...BASE_SCOPES, ...EXTRA_SCOPES])];

const ACCESS_TOKEN_ALG = env.DEVIDP_ACCESS_TOKEN_ALG || 'RS256';
if (!['RS256', 'ES256'].includes(ACCESS_TOKEN_ALG)) fail('DEVIDP_ACCESS_TOKEN_ALG must be RS256 or ES256');
const ACCESS_TOKEN_TTL = Number(env.DEVIDP_ACCESS_TOKEN_TTL || 3600);
if (!Number.isInteger(ACCESS_TOKEN_TTL) || ACCESS_TOKEN_TTL <= 0) fail('DEVIDP_ACCESS_TOKEN_TTL must be a positive integer');
const PKCE_REQUIRED = env.DEVIDP_PKCE_REQUIRED || 'all';
if (!['all', 'public'].includes(PKCE_REQUIRED)) fail('DEVIDP_PKCE_REQUIRED must be "all" or "public"');
const DEV_TOKENS = env.DEVIDP_DEV_TOKENS !== '0';
const LOG_REQUESTS = env.DEVIDP_LOG !== '0';
const RP_LOGOUT = env.DEVIDP_RP_LOGOUT !== '0';
const REGISTRATION = env.DEVIDP_REGISTRATION !== '0';
const ACCESS_TOKEN_FORMAT = env.DEVIDP_ACCESS_TOKEN_FORMAT || 'jwt';
if (!['jwt', 'opaque'].includes(ACCESS_TOKEN_FORMAT)) fail('DEVIDP_ACCESS_TOKEN_FORMAT must be "jwt" or "opaque"');
const SUBJECT_TYPE = env.DEVIDP_SUBJECT_TYPE || 'public';
if (!['public', 'pairwise'].includes(SUBJECT_TYPE)) fail('DEVIDP_SUBJECT_TYPE must be "public" or "pairwise"');
const PAIRWISE_SALT = env.DEVIDP_PAIRWISE_SALT || crypto.randomBytes(32).toString('base64url');

// OIDC Core §8.1: the same user gets a different, stable sub per sector (the client's redirect host).
async function pairwiseIdentifier(_ctx, accountId, client) {
  return crypto.createHash('sha256')
    .update(client.sectorIdentifier)
    .update(accountId)
    .update(PAIRWISE_SALT)
    .digest('hex');
}

let STATIC_CLIENTS = [];
if (env.DEVIDP_CLIENTS && env.DEVIDP_CLIENTS.trim()) {
  try {
    STATIC_CLIENTS = JSON.parse(env.DEVIDP_CLIENTS);
  } catch {
    // Do not echo the parser's message: it may quote a client secret.
    fail('DEVIDP_CLIENTS is not valid JSON');
  }
  if (!Array.isArray(STATIC_CLIENTS)) fail('DEVIDP_CLIENTS must be a JSON array of client objects');
}

// ---------------------------------------------------------------------------
// Signing keys: one RS256 and one ES256 key, distinct kids.
// ---------------------------------------------------------------------------

async function generateSigningKeys() {
  const keys = [];
  for (const [alg, options] of [['RS256', { modulusLength: 2048 }], ['ES256', {}]]) {
    const { privateKey } = await jose.generateKeyPair(alg, { ...options, extractable: true });
    const jwk = await jose.exportJWK(privateKey);
    keys.push(jwk);
  }
  return keys;
}

async function completeJwk(jwk) {
  let alg;
  if (jwk.kty === 'RSA') alg = 'RS256';
  else if (jwk.kty === 'EC' && jwk.crv === 'P-256') alg = 'ES256';
  else return undefined;
  if (!jwk.d) return undefined;
  const kid = jwk.kid || `${alg.toLowerCase()}-${(await jose.calculateJwkThumbprint(jwk)).slice(0, 16)}`;
  return { ...jwk, alg, use: 'sig', kid };
}

async function loadSigningKeys() {
  let raw;
  const file = env.DEVIDP_JWKS_FILE;
  if (file && fs.existsSync(file)) {
    try {
      raw = JSON.parse(fs.readFileSync(file, 'utf8')).keys;
    } catch {
      fail(`DEVIDP_JWKS_FILE ${file} is not a JSON {"keys": [...]} document`);
    }
    if (!Array.isArray(raw)) fail(`DEVIDP_JWKS_FILE ${file} has no "keys" array`);
  } else {
    raw = await generateSigningKeys();
  }
  const keys = (await Promise.all(raw.map(completeJwk))).filter(Boolean);
  const rsa = keys.find((k) => k.alg === 'RS256');
  const ec = keys.find((k) => k.alg === 'ES256');
  if (!rsa || !ec) fail('signing keys must include a private RSA key and a private EC P-256 key');
  if (rsa.kid === ec.kid) fail('signing keys must have distinct kids');
  if (file && !fs.existsSync(file)) {
    try {
      fs.writeFileSync(file, `${JSON.stringify({ keys: [rsa, ec] }, null, 2)}\n`, { mode: 0o600 });
    } catch (err) {
      fail(`cannot write DEVIDP_JWKS_FILE ${file}: ${err.code || err.message}`);
    }
    console.log(`devidp: wrote new signing keys to ${file}`);
  }
  return { RS256: rsa, ES256: ec };
}

const SIGNING_JWKS = await loadSigningKeys();
const SIGNING_KEYS = {
  RS256: { kid: SIGNING_JWKS.RS256.kid, key: await jose.importJWK(SIGNING_JWKS.RS256, 'RS256') },
  ES256: { kid: SIGNING_JWKS.ES256.kid, key: await jose.importJWK(SIGNING_JWKS.ES256, 'ES256') },
};

// ---------------------------------------------------------------------------
// Accounts: any username is an account.
// ---------------------------------------------------------------------------

const MAX_USERNAME = 128;

function validUsername(value) {
  // No control characters; printable Unicode is fine.
  return typeof value === 'string' && value.length > 0 && value.length <= MAX_USERNAME
    && !/[\u0000-\u001f\u007f]/u.test(value);
}

function userClaims(username) {
  return {
    sub: username,
    name: username,
    preferred_username: username,
    email: username.includes('@') ? username : `${username.replace(/\s+/gu, '.')}@example.com`,
    email_verified: true,
  };
}

async function findAccount(_ctx, id) {
  if (!validUsername(id)) return undefined;
  return {
    accountId: id,
    async claims() {
      return userClaims(id);
    },
  };
}

// ---------------------------------------------------------------------------
// Resource indicators (RFC 8707): JWT access tokens for configured resources.
// ---------------------------------------------------------------------------

// The dev IdP grants any scope the client asks for, so a resource server's
// scope list is whatever this request (or the code / refresh token it redeems)
// carries, plus the scopes we always support.
function scopesInPlay(ctx) {
  const scopes = new Set(SUPPORTED_SCOPES);
  const sources = [
    ctx?.oidc?.params?.scope,
    ctx?.oidc?.entities?.AuthorizationCode?.scope,
    ctx?.oidc?.entities?.RefreshToken?.scope,
    ctx?.oidc?.entities?.DeviceCode?.scope,
  ];
  for (const value of sources) {
    if (typeof value === 'string') {
      for (const scope of value.split(' ')) if (scope) scopes.add(scope);
    }
  }
  return [...scopes].join(' ');
}

async function getResourceServerInfo(ctx, resourceIndicator) {
  const resource = configuredResource(resourceIndicator);
  if (!resource) {
    throw new errors.InvalidTarget('resource indicator is not one of DEVIDP_RESOURCES');
  }
  return {
    audience: resource,
    scope: scopesInPlay(ctx),
    accessTokenTTL: ACCESS_TOKEN_TTL,
    accessTokenFormat: ACCESS_TOKEN_FORMAT,
    ...(ACCESS_TOKEN_FORMAT === 'jwt' ? { jwt: { sign: { alg: ACCESS_TOKEN_ALG } } } : {}),
  };
}

// Used when an authorization request names no resource.
async function defaultResource(_ctx, _client, oneOf) {
  if (oneOf) return oneOf[0];
  return RESOURCES[0];
}

// ---------------------------------------------------------------------------
// Automatic consent: every requested scope, claim and resource is granted.
// ---------------------------------------------------------------------------

async function loadExistingGrant(ctx) {
  const { oidc } = ctx;
  const accountId = oidc.session.accountId;
  const grantId = oidc.result?.consent?.grantId || oidc.session.grantIdFor(oidc.client.clientId);
  let grant = grantId ? await oidc.provider.Grant.find(grantId) : undefined;
  if (!grant || grant.accountId !== accountId || grant.clientId !== oidc.client.clientId) {
    grant = new oidc.provider.Grant({ accountId, clientId: oidc.client.clientId });
  }
  const oidcScopes = [...oidc.requestParamOIDCScopes];
  if (oidcScopes.length) grant.addOIDCScope(oidcScopes.join(' '));
  const claims = [...oidc.requestParamClaims];
  if (claims.length) grant.addOIDCClaims(claims);
  for (const [indicator, resourceServer] of Object.entries(oidc.resourceServers)) {
    const scopes = [...oidc.requestParamScopes].filter((s) => resourceServer.scopes.has(s));
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  await grant.save();
  return grant;
}

// ---------------------------------------------------------------------------
// Pages
// ---------------------------------------------------------------------------

function esc(value) {
  return String(value ?? '').replace(/[&<>"']/gu, (c) => ({
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
  })[c]);
}

const BANNER = 'Development identity provider — not for production';

function page(title, body) {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${esc(title)} · ${esc(BANNER)}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:32rem;margin:2rem auto;padding:0 1rem}
.banner{background:#b00020;color:#fff;padding:.75rem 1rem;font-weight:700;border-radius:4px}
label{display:block;margin:1rem 0 .25rem}input{font-size:1rem;padding:.4rem;width:100%;box-sizing:border-box}
button{margin-top:1rem;font-size:1rem;padding:.5rem 1.5rem}.error{color:#b00020}
</style>
</head>
<body>
<p class="banner" role="alert">${esc(BANNER)}</p>
${body}
</body>
</html>
`;
}

function loginPage({
  uid, clientLabel, params = {}, username = '', error,
}) {
  const requested = [
    params.scope ? `<li>scope: <code>${esc(params.scope)}</code></li>` : '',
    params.resource ? `<li>resource: <code>${esc([].concat(params.resource).join(' '))}</code></li>` : '',
  ].join('');
  return page('Sign in', `<h1>Sign in</h1>
<p>Signing in to <strong>${esc(clientLabel)}</strong>. Type any username; there is no password. The username becomes the token's <code>sub</code>.</p>
${requested ? `<ul>${requested}</ul>` : ''}
${error ? `<p class="error">${esc(error)}</p>` : ''}
<form method="post" action="/interaction/${esc(uid)}/login">
<label for="username">Username</label>
<input id="username" name="username" type="text" value="${esc(username)}" maxlength="${MAX_USERNAME}" autocomplete="username" autofocus required>
<button type="submit">Sign in</button>
</form>`);
}

// RP-initiated logout: the confirm page (oidc-provider's form, our buttons; "logout=yes" ends the whole
// session, the other button only this client's part of it) and the page shown when no
// post_logout_redirect_uri was given. oidc-provider's own pages load web fonts from elsewhere.
async function logoutSource(ctx, form) {
  const client = ctx.oidc.client;
  const label = client ? (client.clientName || client.clientId) : '';
  ctx.body = page('Sign out', `<h1>Sign out</h1>
<p>${label ? `<strong>${esc(label)}</strong> asks to sign you out. ` : ''}Do you want to sign out of this identity provider?</p>
${form}
<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>`);
}

async function postLogoutSuccessSource(ctx) {
  ctx.body = page('Signed out', '<h1>Signed out</h1><p>You are signed out of this identity provider.</p>');
}

async function renderError(ctx, out) {
  ctx.type = 'html';
  ctx.body = page('Error', `<h1>Error</h1>
<p><code>${esc(out.error)}</code></p>
${out.error_description ? `<p>${esc(out.error_description)}</p>` : ''}`);
}

// ---------------------------------------------------------------------------
// Provider
// ---------------------------------------------------------------------------

const configuration = {
  clients: STATIC_CLIENTS,
  jwks: { keys: [SIGNING_JWKS.RS256, SIGNING_JWKS.ES256] },
  findAccount,
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
  },
  scopes: SUPPORTED_SCOPES,
  // With only "pairwise" listed, oidc-provider makes it every client's default subject_type.
  subjectTypes: [SUBJECT_TYPE],
  pairwiseIdentifier,
  // RFC 7591 says grant_types defaults to authorization_code only; a dev IdP
  // lets clients that omit it refresh too.
  clientDefaults: {
    grant_types: ['authorization_code', 'refresh_token'],
    id_token_signed_response_alg: 'RS256',
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  },
  responseTypes: ['code'],
  cookies: {
    keys: [crypto.randomBytes(32).toString('base64url')],
    // oidc-provider 8 defaults the session cookie to SameSite=None, which
    // browsers drop unless Secure; Lax works over plain http. Koa sets Secure
    // only on https requests.
    long: { httpOnly: true, sameSite: 'lax' },
    short: { httpOnly: true, sameSite: 'lax' },
  },
  pkce: {
    required: (_ctx, client) => PKCE_REQUIRED === 'all' || client.clientAuthMethod === 'none',
  },
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: REGISTRATION, initialAccessToken: false },
    revocation: { enabled: true },
    introspection: {
      enabled: true,
      allowedPolicy: async (_ctx, client, token) => client.clientAuthMethod !== 'none' || token.clientId === client.clientId,
    },
    userinfo: { enabled: true },
    rpInitiatedLogout: { enabled: RP_LOGOUT, logoutSource, postLogoutSuccessSource },
    resourceIndicators: {
      enabled: true,
      defaultResource,
      getResourceServerInfo,
      useGrantedResource: async () => false,
    },
  },
  // Refresh tokens for every client allowed the refresh_token grant, with or
  // without offline_access; they outlive the browser session.
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  expiresWithSession: async () => false,
  // Revoking an access token leaves the grant (and its refresh token) alone;
  // revoking a refresh token revokes the whole grant.
  revokeGrantPolicy: (ctx) => !(ctx.oidc.route === 'revocation' && ctx.oidc.entities.AccessToken),
  loadExistingGrant,
  clientBasedCORS: () => true,
  renderError,
  ttl: {
    AccessToken: (_ctx, token) => token.resourceServer?.accessTokenTTL || ACCESS_TOKEN_TTL,
    AuthorizationCode: 60,
    ClientCredentials: 600,
    DeviceCode: 600,
    BackchannelAuthenticationRequest: 600,
    IdToken: 3600,
    Interaction: 3600,
    RefreshToken: 14 * 24 * 3600,
    Session: 14 * 24 * 3600,
    Grant: 14 * 24 * 3600,
  },
};

const provider = new Provider(ISSUER, configuration);
provider.proxy = env.DEVIDP_TRUST_PROXY === '1';

// Validate static clients now rather than at first use.
for (const metadata of STATIC_CLIENTS) {
  try {
    await provider.Client.find(metadata.client_id);
  } catch (err) {
    fail(`DEVIDP_CLIENTS entry ${JSON.stringify(String(metadata?.client_id))} is invalid: ${err.error_description || err.message}`);
  }
}

// Never log tokens: only error codes and descriptions.
for (const event of [
  'authorization.error', 'grant.error', 'registration_create.error', 'revocation.error',
  'userinfo.error', 'introspection.error', 'discovery.error', 'jwks.error', 'end_session.error',
]) {
  provider.on(event, (_ctx, err) => {
    console.log(`devidp: ${event}: ${err.error || err.name}${err.error_description ? ` (${err.error_description})` : ''}${err.error_detail ? ` [${err.error_detail}]` : ''}`);
  });
}
provider.on('server_error', (_ctx, err) => {
  console.error('devidp: server_error:', err);
});

// ---------------------------------------------------------------------------
// Development routes, counters and faults (Koa middleware ahead of the provider)
// ---------------------------------------------------------------------------

const stats = {
  token_requests: 0,
  refresh_requests: 0,
  revocations: 0,
  authorization_requests: 0,
  registrations: 0,
  userinfo_requests: 0,
  introspection_requests: 0,
};
const faults = {
  token_endpoint: 'ok',
  token_endpoint_delay_ms: 0,
  authorization_endpoint: 'ok',
  authorization_client_id: null,
  introspection_endpoint: 'ok',
};
// "unavailable": POST /token/introspection answers 503 (an introspection endpoint that is down).
const INTROSPECTION_FAULTS = new Set(['ok', 'unavailable']);
const MAX_TOKEN_DELAY_MS = 60000;
const TOKEN_FAULTS = new Set(['ok', 'error', 'unavailable']);
// "deny": the authorization endpoint answers as if the user refused (error=access_denied back to the
// client's registered redirect_uri); "hold": it shows a page and never redirects (the user walked away).
// Scoped to one client_id when authorization_client_id is set, so other clients' logins still work.
const AUTHORIZATION_FAULTS = new Set(['ok', 'deny', 'hold']);

async function authorizationFault(ctx) {
  const { query } = ctx;
  const clientId = typeof query.client_id === 'string' ? query.client_id : '';
  if (faults.authorization_client_id && clientId !== faults.authorization_client_id) return false;
  ctx.set('Cache-Control', 'no-store');
  if (faults.authorization_endpoint === 'hold') {
    ctx.status = 200;
    ctx.type = 'html';
    ctx.body = page('Authorization held', '<h1>Authorization held</h1><p>devidp fault "hold": this request is never answered.</p>');
    return true;
  }
  let client;
  try {
    client = await provider.Client.find(clientId);
  } catch {
    client = undefined;
  }
  const redirectUri = typeof query.redirect_uri === 'string' ? query.redirect_uri : '';
  if (!client || !client.redirectUriAllowed(redirectUri)) {
    ctx.status = 400;
    await renderError(ctx, { error: 'invalid_request', error_description: 'unknown client or redirect_uri' });
    return true;
  }
  const target = new URL(redirectUri);
  target.searchParams.set('error', 'access_denied');
  target.searchParams.set('error_description', 'the user denied access (devidp fault)');
  if (typeof query.state === 'string') target.searchParams.set('state', query.state);
  target.searchParams.set('iss', ISSUER);
  ctx.status = 303;
  ctx.redirect(target.href);
  return true;
}
const BODY_LIMIT = 56 * 1024;

async function readRawBody(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > BODY_LIMIT) throw Object.assign(new Error('request body too large'), { status: 413 });
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function readParams(ctx) {
  const raw = await readRawBody(ctx.req);
  if (ctx.is('application/json')) {
    if (!raw.trim()) return {};
    try {
      const value = JSON.parse(raw);
      if (value && typeof value === 'object' && !Array.isArray(value)) return value;
    } catch {
      // fall through
    }
    throw Object.assign(new Error('request body must be a JSON object'), { status: 400 });
  }
  return { ...querystring.parse(raw) };
}

function jsonError(ctx, status, error, description) {
  ctx.status = status;
  ctx.set('Cache-Control', 'no-store');
  ctx.body = { error, error_description: description };
}

function intParam(value, name) {
  if (value === undefined || value === null || value === '') return undefined;
  const n = typeof value === 'number' ? value : Number(value);
  if (!Number.isInteger(n)) throw Object.assign(new Error(`${name} must be an integer`), { status: 400 });
  return n;
}

async function mintDevToken(ctx) {
  const p = await readParams(ctx);
  const { username } = p;
  if (!validUsername(username)) return jsonError(ctx, 400, 'invalid_request', 'username is required');
  const alg = p.alg || 'RS256';
  if (!SIGNING_KEYS[alg]) return jsonError(ctx, 400, 'invalid_request', 'alg must be RS256 or ES256');
  let aud;
  if (p.audience !== undefined && p.audience !== null && p.audience !== '') {
    if (typeof p.audience !== 'string') return jsonError(ctx, 400, 'invalid_request', 'audience must be a string');
    aud = p.audience; // deliberate override for negative tests; not checked
  } else {
    const requested = p.resource ?? RESOURCES[0];
    aud = configuredResource(requested);
    if (!aud) return jsonError(ctx, 400, 'invalid_target', 'resource is not one of DEVIDP_RESOURCES');
  }
  const scope = p.scope === undefined ? 'openid' : String(p.scope);
  let expiresIn;
  let notBeforeIn;
  try {
    expiresIn = intParam(p.expires_in, 'expires_in') ?? ACCESS_TOKEN_TTL;
    notBeforeIn = intParam(p.not_before_in, 'not_before_in');
  } catch (err) {
    return jsonError(ctx, 400, 'invalid_request', err.message);
  }
  const clientId = typeof p.client_id === 'string' && p.client_id ? p.client_id : 'devidp-dev-token';
  const now = Math.floor(Date.now() / 1000);
  const exp = now + expiresIn;
  // An already-expired token looks like one issued an hour before it expired.
  const iat = expiresIn > 0 ? now : exp - 3600;
  const payload = {
    jti: crypto.randomUUID(), sub: username, iat, exp, scope, client_id: clientId, iss: ISSUER, aud,
  };
  if (notBeforeIn !== undefined) payload.nbf = now + notBeforeIn;
  const { key, kid } = SIGNING_KEYS[alg];
  const accessToken = await new jose.SignJWT(payload)
    .setProtectedHeader({ alg, kid, typ: 'at+jwt' })
    .sign(key);
  ctx.set('Cache-Control', 'no-store');
  ctx.body = {
    access_token: accessToken, token_type: 'Bearer', expires_in: expiresIn, scope,
  };
  return undefined;
}

async function interactionClientLabel(params) {
  try {
    const client = await provider.Client.find(params.client_id);
    return client?.clientName || params.client_id;
  } catch {
    return params.client_id;
  }
}

async function showInteraction(ctx, uid) {
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== uid) throw new errors.SessionNotFound('interaction does not match the cookie');
  ctx.set('Cache-Control', 'no-store');
  if (details.prompt.name === 'login') {
    ctx.type = 'html';
    ctx.body = loginPage({
      uid,
      clientLabel: await interactionClientLabel(details.params),
      params: details.params,
      username: details.params.login_hint || '',
    });
    return;
  }
  // Any other prompt (consent): grant automatically. loadExistingGrant has
  // already granted everything requested; this just records the decision.
  const redirectTo = await provider.interactionResult(ctx.req, ctx.res, { consent: {} }, { mergeWithLastSubmission: true });
  ctx.status = 303;
  ctx.redirect(redirectTo);
}

async function submitLogin(ctx, uid) {
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== uid) throw new errors.SessionNotFound('interaction does not match the cookie');
  const form = await readParams(ctx);
  const username = typeof form.username === 'string' ? form.username.trim() : '';
  if (!validUsername(username)) {
    ctx.status = 400;
    ctx.type = 'html';
    ctx.body = loginPage({
      uid,
      clientLabel: await interactionClientLabel(details.params),
      params: details.params,
      username,
      error: `Type a username (1-${MAX_USERNAME} characters, no control characters).`,
    });
    return;
  }
  // consent: {} also satisfies the "native clients require interaction" check.
  const redirectTo = await provider.interactionResult(ctx.req, ctx.res, {
    login: { accountId: username },
    consent: {},
  }, { mergeWithLastSubmission: false });
  ctx.status = 303;
  ctx.redirect(redirectTo);
}

// DCR leniency: MCP clients often register the resource's scopes (e.g.
// "files:read") in `scope`; oidc-provider rejects any value it does not know.
// Those scopes are requested per resource anyway, so drop unknown values from
// the registered scope (the registered list only restricts OIDC scopes).
async function lenientRegistration(ctx) {
  if (!ctx.is('application/json')) return;
  const raw = await readRawBody(ctx.req);
  let body = raw;
  try {
    const parsed = JSON.parse(raw);
    if (parsed && typeof parsed === 'object' && typeof parsed.scope === 'string') {
      const known = new Set(SUPPORTED_SCOPES);
      const kept = parsed.scope.split(' ').filter((s) => known.has(s));
      const dropped = parsed.scope.split(' ').filter((s) => s && !known.has(s));
      if (dropped.length) {
        if (kept.length) parsed.scope = kept.join(' ');
        else delete parsed.scope;
        console.log(`devidp: registration: ignoring scope values not in scopes_supported: ${dropped.join(' ')}`);
      }
    }
    body = parsed;
  } catch {
    // Let oidc-provider report the malformed body.
  }
  // oidc-provider reads an already-consumed body from req.body.
  ctx.req.body = body;
}

function cors(ctx) {
  ctx.set('Access-Control-Allow-Origin', '*');
  ctx.set('Access-Control-Allow-Methods', 'GET, POST, DELETE, OPTIONS');
  ctx.set('Access-Control-Allow-Headers', 'Content-Type, Authorization, MCP-Protocol-Version');
  ctx.set('Access-Control-Max-Age', '600');
}

const routes = provider.pathFor.bind(provider);
const TOKEN_PATH = routes('token');
const REVOCATION_PATH = routes('revocation');
// Without registration there is no such route; '/reg' is where it would be (and is a 404 then).
const REGISTRATION_PATH = REGISTRATION ? routes('registration') : '/reg';
const AUTHORIZATION_PATH = routes('authorization');
const USERINFO_PATH = routes('userinfo');
const INTROSPECTION_PATH = routes('introspection');

const RFC8414_DISCOVERY = '/.well-known/oauth-authorization-server';
const OIDC_DISCOVERY = '/.well-known/openid-configuration';

provider.use(async (ctx, next) => {
  const started = Date.now();
  const { method, path } = ctx;
  let note = '';
  try {
    // RFC 8414 metadata: the same document as OpenID discovery.
    if (path === RFC8414_DISCOVERY && (method === 'GET' || method === 'HEAD' || method === 'OPTIONS')) {
      ctx.path = OIDC_DISCOVERY;
      return await next();
    }

    // Counters and faults for standard endpoints.
    if (path === TOKEN_PATH && method === 'POST') {
      stats.token_requests += 1;
      if (ctx.is('application/x-www-form-urlencoded')) {
        const raw = await readRawBody(ctx.req);
        const grantType = querystring.parse(raw).grant_type;
        note = ` grant_type=${typeof grantType === 'string' ? grantType : '?'}`;
        if (grantType === 'refresh_token') stats.refresh_requests += 1;
        if (faults.token_endpoint_delay_ms > 0 && (grantType === 'authorization_code' || grantType === 'refresh_token')) {
          // A slow provider: the request is counted at once, answered after the delay.
          note += ` (delayed ${faults.token_endpoint_delay_ms}ms)`;
          await new Promise((resolve) => { setTimeout(resolve, faults.token_endpoint_delay_ms); });
        }
        if (faults.token_endpoint !== 'ok' && (grantType === 'authorization_code' || grantType === 'refresh_token')) {
          note += ` (fault: ${faults.token_endpoint})`;
          if (faults.token_endpoint === 'unavailable') {
            return jsonError(ctx, 503, 'temporarily_unavailable', 'fault injected by devidp');
          }
          return jsonError(ctx, 400, 'invalid_grant', 'fault injected by devidp');
        }
        // oidc-provider reads an already-consumed body from req.body.
        ctx.req.body = raw;
      }
      return await next();
    }
    if (path === REVOCATION_PATH && method === 'POST') {
      stats.revocations += 1;
      return await next();
    }
    if (path === INTROSPECTION_PATH && method === 'POST') {
      stats.introspection_requests += 1;
      if (faults.introspection_endpoint === 'unavailable') {
        note = ' (fault: unavailable)';
        return jsonError(ctx, 503, 'temporarily_unavailable', 'fault injected by devidp');
      }
      return await next();
    }
    if (path === AUTHORIZATION_PATH && method === 'GET') {
      stats.authorization_requests += 1;
      if (faults.authorization_endpoint !== 'ok' && await authorizationFault(ctx)) {
        note = ` (fault: ${faults.authorization_endpoint})`;
        return undefined;
      }
      return await next();
    }
    if (path === USERINFO_PATH && (method === 'GET' || method === 'POST')) {
      stats.userinfo_requests += 1;
      return await next();
    }
    if (path === REGISTRATION_PATH) {
      cors(ctx);
      if (method === 'OPTIONS') {
        ctx.status = 204;
        return undefined;
      }
      if (method === 'POST') {
        stats.registrations += 1;
        await lenientRegistration(ctx);
      }
      return await next();
    }

    // Login interaction.
    let m = /^\/interaction\/([^/]+)$/u.exec(path);
    if (m && method === 'GET') return await showInteraction(ctx, m[1]);
    m = /^\/interaction\/([^/]+)\/login$/u.exec(path);
    if (m && method === 'POST') return await submitLogin(ctx, m[1]);

    // Development endpoints.
    if (path.startsWith('/dev/')) {
      cors(ctx);
      ctx.set('Cache-Control', 'no-store');
      if (method === 'OPTIONS') {
        ctx.status = 204;
        return undefined;
      }
      if (path === '/dev/health' && method === 'GET') {
        ctx.body = { status: 'ok', issuer: ISSUER };
        return undefined;
      }
      if (path === '/dev/stats' && method === 'GET') {
        ctx.body = { ...stats };
        return undefined;
      }
      if (path === '/dev/stats' && method === 'DELETE') {
        for (const key of Object.keys(stats)) stats[key] = 0;
        ctx.body = { ...stats };
        return undefined;
      }
      if (path === '/dev/faults' && method === 'GET') {
        ctx.body = { ...faults };
        return undefined;
      }
      if (path === '/dev/faults' && method === 'POST') {
        const p = await readParams(ctx);
        if (p.token_endpoint !== undefined) {
          if (!TOKEN_FAULTS.has(p.token_endpoint)) {
            return jsonError(ctx, 400, 'invalid_request', `token_endpoint must be one of ${[...TOKEN_FAULTS].join(', ')}`);
          }
          faults.token_endpoint = p.token_endpoint;
        }
        if (p.token_endpoint_delay_ms !== undefined) {
          const delay = Number(p.token_endpoint_delay_ms);
          if (!Number.isInteger(delay) || delay < 0 || delay > MAX_TOKEN_DELAY_MS) {
            return jsonError(ctx, 400, 'invalid_request', `token_endpoint_delay_ms must be an integer 0..${MAX_TOKEN_DELAY_MS}`);
          }
          faults.token_endpoint_delay_ms = delay;
        }
        if (p.introspection_endpoint !== undefined) {
          if (!INTROSPECTION_FAULTS.has(p.introspection_endpoint)) {
            return jsonError(ctx, 400, 'invalid_request', `introspection_endpoint must be one of ${[...INTROSPECTION_FAULTS].join(', ')}`);
          }
          faults.introspection_endpoint = p.introspection_endpoint;
        }
        if (p.authorization_endpoint !== undefined) {
          if (!AUTHORIZATION_FAULTS.has(p.authorization_endpoint)) {
            return jsonError(ctx, 400, 'invalid_request', `authorization_endpoint must be one of ${[...AUTHORIZATION_FAULTS].join(', ')}`);
          }
          if (p.client_id !== undefined && p.client_id !== null && typeof p.client_id !== 'string') {
            return jsonError(ctx, 400, 'invalid_request', 'client_id must be a string');
          }
          faults.authorization_endpoint = p.authorization_endpoint;
          faults.authorization_client_id = p.authorization_endpoint === 'ok' ? null : (p.client_id || null);
        }
        ctx.body = { ...faults };
        return undefined;
      }
      if (path === '/dev/token' && method === 'POST' && DEV_TOKENS) {
        return await mintDevToken(ctx);
      }
      return jsonError(ctx, 404, 'not_found', 'no such development endpoint');
    }

    return await next();
  } catch (err) {
    if (err instanceof errors.OIDCProviderError) {
      ctx.status = err.statusCode || 400;
      await renderError(ctx, { error: err.error, error_description: err.error_description });
      return undefined;
    }
    if (err && err.status >= 400 && err.status < 500) {
      return jsonError(ctx, err.status, 'invalid_request', err.message);
    }
    throw err;
  } finally {
    if (LOG_REQUESTS) {
      // Path only: query strings and bodies may carry codes or tokens.
      console.log(`devidp: ${method} ${path} -> ${ctx.status}${note} ${Date.now() - started}ms`);
    }
  }
});

const server = provider.listen(PORT, HOST, () => {
  console.log(`devidp: ${BANNER}`);
  console.log(`devidp: issuer ${ISSUER}, listening on ${HOST}:${PORT}`);
  console.log(`devidp: resources: ${RESOURCES.length ? RESOURCES.join(', ') : '(none)'}`);
  console.log(`devidp: static clients: ${STATIC_CLIENTS.map((c) => c.client_id).join(', ') || '(none)'}`);
  console.log(`devidp: signing keys: RS256 kid=${SIGNING_KEYS.RS256.kid}, ES256 kid=${SIGNING_KEYS.ES256.kid}`);
  console.log(`devidp: /dev/token ${DEV_TOKENS ? 'enabled' : 'disabled'}`);
  console.log(`devidp: access tokens ${ACCESS_TOKEN_FORMAT}, subjects ${SUBJECT_TYPE}, registration ${REGISTRATION ? 'open' : 'off'}`);
});
server.on('error', (err) => fail(`cannot listen on ${HOST}:${PORT}: ${err.message}`));

function shutdown(signal) {
  console.log(`devidp: ${signal}, shutting down`);
  server.close(() => process.exit(0));
  server.closeAllConnections?.();
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
