/* DOM helpers. Everything the server sends is untrusted text (device names come from the field), so
 * the DOM is built with createElement + textContent only, never innerHTML with data. */

export function $(id) {
  return document.getElementById(id);
}

/** createElement with text and attributes; text always goes through textContent. */
export function el(tag, attrs, text) {
  var node = document.createElement(tag);
  if (attrs) {
    for (var k in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, k) && attrs[k] != null) node.setAttribute(k, attrs[k]);
    }
  }
  if (text != null) node.textContent = String(text);
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

/** A CSS custom property of the page (the theme's colours follow light/dark mode). */
export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}
