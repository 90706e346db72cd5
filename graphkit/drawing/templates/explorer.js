// The notebook explorer's diagram: zoom and pan (svg-pan-zoom, vendored beside this file), click a node
// or a group box to select it, and bring the selected group into view. graphkit/drawing/panels.py puts
// this file and the library into the diagram's HTML as text; a tiny handler runs them once per page.
// Clicks reach Python through a hidden ipywidgets Text ("graphkit-click-target"): setting its value and
// sending an "input" event is what typing into it does, so the widget syncs the value to the kernel.
window.graphkitAttach = function (view) {
  var svg = view.querySelector('svg');
  if (!svg || svg.getAttribute('data-graphkit-attached')) return;
  svg.setAttribute('data-graphkit-attached', '1');
  var host = view.querySelector('.graphkit-zoom-host');
  svg.removeAttribute('width');
  svg.removeAttribute('height');
  svg.style.width = '100%';
  svg.style.height = '100%';
  var zoom = null;
  if (window.svgPanZoom) {
    zoom = window.svgPanZoom(svg, {
      zoomEnabled: true, panEnabled: true, controlIconsEnabled: true, dblClickZoomEnabled: false,
      mouseWheelZoomEnabled: true, preventMouseEventsDefault: true, fit: true, center: true,
      minZoom: 0.05, maxZoom: 40, zoomScaleSensitivity: 0.3
    });
    view.graphkitZoom = zoom;
    svg.graphkitZoom = zoom;
  }
  var explorer = view.closest('.graphkit-explorer') || document;
  function send(value) {
    var input = explorer.querySelector('.graphkit-click-target input');
    if (!input) return;
    input.value = value + '@' + Date.now();  // a new value each click, so picking twice still reports
    input.dispatchEvent(new Event('input', { bubbles: true }));
    input.dispatchEvent(new Event('change', { bubbles: true }));
  }
  // A click that ends a drag is a pan, not a pick.
  var down = null;
  svg.addEventListener('mousedown', function (event) { down = [event.clientX, event.clientY]; }, true);
  svg.addEventListener('click', function (event) {
    if (down && Math.abs(event.clientX - down[0]) + Math.abs(event.clientY - down[1]) > 4) return;
    var target = event.target;
    if (target.closest && target.closest('#svg-pan-zoom-controls')) return;
    var node = target.closest ? target.closest('g.node') : null;
    if (node) {
      var title = node.querySelector('title');
      if (title) send('node:' + title.textContent);
      return;
    }
    var cluster = target.closest ? target.closest('g.cluster') : null;
    if (cluster && cluster.id && cluster.id.indexOf('graphkit-group-') === 0) {
      send('group:' + cluster.id.slice('graphkit-group-'.length));
    }
  });
  var focus = host && host.getAttribute('data-focus');
  var viewport = svg.querySelector('.svg-pan-zoom_viewport');
  var element = zoom && focus && viewport ? svg.querySelector(focus) : null;
  if (element) {
    // The element's centre and size in viewport coordinates (independent of the current pan and zoom,
    // which svg-pan-zoom applies on the next animation frame), then one zoom and one absolute pan.
    var matrix = viewport.getCTM().inverse().multiply(element.getCTM());
    var bbox = element.getBBox();
    var cx = bbox.x + bbox.width / 2, cy = bbox.y + bbox.height / 2;
    var ux = matrix.a * cx + matrix.c * cy + matrix.e, uy = matrix.b * cx + matrix.d * cy + matrix.f;
    var width = Math.abs(matrix.a * bbox.width) || 1, height = Math.abs(matrix.d * bbox.height) || 1;
    var sizes = zoom.getSizes();
    var scale = sizes.realZoom;
    // Zoom in until the element fills about 60% of the view, at most 4 times the fit; never zoom out.
    var wanted = Math.min(sizes.width / width, sizes.height / height) * 0.6;
    var target = Math.max(scale, Math.min(wanted, 4 * scale));
    if (target > scale * 1.01) zoom.zoomBy(target / scale);
    zoom.pan({ x: sizes.width / 2 - target * ux, y: sizes.height / 2 - target * uy });
  }
  svg.setAttribute('data-graphkit-ready', '1');
};
