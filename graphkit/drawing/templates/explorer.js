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
  if (zoom && focus) {
    var element = svg.querySelector('[id="' + focus + '"]') || svg.querySelector('g.node.graphkit-selected');
    if (element) {
      var box = element.getBoundingClientRect();
      var frame = svg.getBoundingClientRect();
      // Zoom so that the element fills at most 60% of the view (never zoom out below the fit), then centre it.
      var scale = Math.min(frame.width / Math.max(box.width, 1), frame.height / Math.max(box.height, 1)) * 0.6;
      if (scale > 1) {
        zoom.zoomAtPointBy(Math.min(scale, 4), {
          x: box.left + box.width / 2 - frame.left, y: box.top + box.height / 2 - frame.top
        });
        box = element.getBoundingClientRect();
      }
      zoom.panBy({
        x: frame.left + frame.width / 2 - (box.left + box.width / 2),
        y: frame.top + frame.height / 2 - (box.top + box.height / 2)
      });
    }
  }
  svg.setAttribute('data-graphkit-ready', '1');
};
