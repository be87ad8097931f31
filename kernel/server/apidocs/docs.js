// The API's docs page (GET /api/v1/docs): Swagger UI over the server's OpenAPI document, from files
// shipped in the package (no CDN), with no inline script. The page and these files are public and hold
// no data; the document needs the token when the server has one (FLOWKERNEL_API_TOKEN): the page asks
// for it, keeps it for the tab as the web UI does, and sends it with the document's requests and with
// every "Try it out".

const TOKEN_KEY = "flowkernel.apiToken"; // the web UI's key: one token per browser tab for both pages
const DOCUMENT = new URL("openapi.json", document.baseURI); // /api/v1/docs -> /api/v1/openapi.json

function askForToken(refused) {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  if (refused) {
    document.getElementById("token-message").textContent = "That token was refused. Enter the server's API " +
      "token (FLOWKERNEL_API_TOKEN).";
  }
  form.hidden = false;
  input.value = "";
  input.focus();
  return new Promise((resolve) => {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      form.hidden = true;
      sessionStorage.setItem(TOKEN_KEY, input.value);
      resolve(input.value);
    }, { once: true });
  });
}

function showProblem(text) {
  const line = document.getElementById("problem");
  line.textContent = text;
  line.hidden = false;
}

async function load() {
  let token = sessionStorage.getItem(TOKEN_KEY);
  let refused = false;
  for (;;) {
    let response;
    try {
      response = await fetch(DOCUMENT, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
    } catch (error) {
      showProblem(`The server did not answer (${error.message}).`);
      return;
    }
    if (response.status === 401) {
      token = await askForToken(refused || Boolean(token));
      refused = true;
      continue;
    }
    if (!response.ok) {
      showProblem(`GET ${DOCUMENT.pathname} answered ${response.status}.`);
      return;
    }
    const spec = await response.json();
    window.SwaggerUIBundle({
      spec,
      dom_id: "#swagger-ui",
      validatorUrl: null, // nothing is sent anywhere but this server
      requestInterceptor: (request) => {
        const current = sessionStorage.getItem(TOKEN_KEY);
        if (current && !request.headers.Authorization) request.headers.Authorization = `Bearer ${current}`;
        return request;
      },
    });
    return;
  }
}

load();
