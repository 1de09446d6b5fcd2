// The REST API reference (/docs): Swagger UI from the installed Python package, started here rather than in
// an inline script, so the page works under the app's Content-Security-Policy and offline.
const el = document.getElementById("swagger-ui");
window.SwaggerUIBundle({
  url: el.dataset.specUrl,
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [window.SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
